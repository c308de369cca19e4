"""Where a load's time goes in `kvgate bench kv-gpu`: each stage of the connector's load path
timed on its own, for the same chunks as the cell.

- read: the tier returns the verified, decoded chunks on the host (`ChunkStore.get_many`;
  checksums and, for disk, the file reads with the page cache dropped);
- pack: the host copy of their stored parts into staging buffers of the pool (CUDA only);
- h2d: those bytes over the bus at the pinned speed this run measured (computed, not timed
  again);
- device: dequantizing on the device and scattering every layer into the engine's blocks,
  from parts already on the device.

The stages run one after another here; the loader overlaps the bus and device stages with the
host ones, so their sum bounds the load from above, and what the load took beyond the largest
stage is the per-chunk Python and the waits between them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from kvgate.engines.vllm.kv_connector.staging import StagingPool, groups_of, packed_offsets
from kvgate.engines.vllm.kv_connector.worker import LoadSpec, PagedKV
from kvgate.tools.bench.kv_gpu_model import sync
from kvgate.tools.bench.pagecache import PageCache, files_under


def bus_gbps(device: torch.device, nbytes: int = 256 << 20) -> dict[str, float]:
    """Host-to-device GB/s from pinned and from pageable memory (median of 3)."""
    if device.type != "cuda":
        return {}
    out = {}
    for name, pinned in (("h2d_pinned_gbps", True), ("h2d_pageable_gbps", False)):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
        times = []
        for _ in range(4):
            sync(device)
            t0 = time.perf_counter()
            dev.copy_(host, non_blocking=pinned)
            sync(device)
            times.append(time.perf_counter() - t0)
        out[name] = round(nbytes / sorted(times[1:])[1] / 1e9, 2)
    return out


def load_breakdown(
    store: Any,
    kv: PagedKV,
    spec: LoadSpec,
    pool: StagingPool,
    group_bytes: int,
    h2d_gbps: float | None,
    page_cache: PageCache,
    disk_dir: Path | None,
) -> dict[str, float]:
    """Seconds of each stage for `spec`'s chunks (see the module's docstring)."""
    device = kv.device
    if disk_dir is not None:
        page_cache.drop(files_under(disk_dir))
    t0 = time.perf_counter()
    chunks = store.get_many(spec.hashes, [], salt=spec.salt)
    read_s = time.perf_counter() - t0
    parts = [[p for p in c.parts] for c in chunks]
    sizes = [sum(p.numel() * p.element_size() for p in ps) for ps in parts]
    out = {"read_s": round(read_s, 5), "chunks": len(chunks)}
    if device.type == "cuda":
        t0 = time.perf_counter()
        for run in groups_of(sizes, group_bytes):
            flat = [p for i in run for p in parts[i]]
            offsets, total = packed_offsets([p.numel() * p.element_size() for p in flat])
            lease = pool.lease(total)
            if lease is None:
                break
            for p, off in zip(flat, offsets):
                lease.view(off, p.shape, p.dtype).copy_(p)
            lease.release()
        out["pack_s"] = round(time.perf_counter() - t0, 5)
        if h2d_gbps:
            out["h2d_s"] = round(sum(sizes) / h2d_gbps / 1e9, 5)
    on_device = [[p.to(device) for p in ps] for ps in parts]
    idx = kv.index([b for ids in spec.block_ids for b in ids])
    sync(device)
    t0 = time.perf_counter()
    pieces = [c.expand(ps) for c, ps in zip(chunks, on_device)]
    rows = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]
    for layer, r in zip(kv.layers, rows.unbind(0)):
        kv.write(layer, idx, r)
    sync(device)
    out["device_s"] = round(time.perf_counter() - t0, 5)
    return out
