"""Reading a connector's disk tier back in the bench's own process (`kvgate bench vllm-kv`): the
tier's read path (read, checksum, header) and the dequantizing after it, timed apart, against a
plain read of the same files, each after dropping them from the page cache; and the stored bytes
per token."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kvgate.index.kv.chunks import DiskTier
from kvgate.index.kv.chunks.layer_codec import LayerCodec
from kvgate.tools.bench.pagecache import PageCache, files_under


def read_back(directory: Path, *, block_size: int = 128) -> dict[str, Any]:
    tier = DiskTier(directory, 1 << 40)
    keys = sorted(tier.keys())
    files = files_under(directory)
    cache = PageCache("auto")
    codec = LayerCodec()
    cache.drop(files)
    stored = delivered = tokens = 0
    read_s = dequant_s = 0.0
    for key in keys:
        t0 = time.perf_counter()
        data = tier.get(key)
        if data is None:
            continue
        chunk = codec.decode(data, key)  # checksum, key and header verified
        t1 = time.perf_counter()
        rows = chunk.tensors()
        dequant_s += time.perf_counter() - t1
        read_s += t1 - t0
        stored += len(data)
        delivered += sum(r.numel() * r.element_size() for r in rows)
        tokens += chunk.shapes[0][0] * block_size
    load_s = read_s + dequant_s
    data_files = [f for f in files if not f.name.startswith("cache.db")]
    cache.drop(files)
    t0 = time.perf_counter()
    raw = 0
    for f in data_files:
        with open(f, "rb") as fh:
            raw += len(fh.read())
    raw_s = time.perf_counter() - t0
    tier.close()
    return {
        "chunks": len(keys),
        "stored_bytes": stored,
        "kv_bytes_delivered": delivered,
        "tokens": tokens,
        "bytes_per_token": stored / tokens if tokens else None,
        # the tier's read path (read + verify), what a disk must deliver
        "read_gbps": stored / read_s / 1e9 if read_s else None,
        # and with dequantizing on this CPU (on a GPU that runs on the device)
        "load_gbps": stored / load_s / 1e9 if load_s else None,
        "kv_delivered_gbps": delivered / load_s / 1e9 if load_s else None,
        "read_s": read_s,
        "dequant_s": dequant_s,
        "raw_read_bytes": raw,
        "raw_read_gbps": raw / raw_s / 1e9 if raw_s else None,
        "load_s": load_s,
        "page_cache": cache.report(),
    }


def example_bytes_per_token(directory: Path) -> float | None:
    """vLLM's ExampleConnector's stored bytes per token: one folder per prompt, one safetensors
    file per layer; the tokens are read from each folder's first file's header."""
    import json
    import struct

    stored = tokens = 0
    for folder in (p for p in directory.iterdir() if p.is_dir()) if directory.exists() else ():
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            continue
        with open(files[0], "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            shape = json.loads(fh.read(n))["kv_cache"]["shape"]
        stored += sum(f.stat().st_size for f in files)
        tokens += int(shape[0])
    return stored / tokens if tokens else None
