"""Chunk load bandwidth in `kvgate bench kv`: the disk tier, the memory tier, the disk tier's read
and decode apart, and a raw sequential file read of the same bytes for comparison.

Every timed disk read follows a page-cache drop (kvgate.tools.bench.pagecache). Bytes per second are of
decoded tensors for the tiers, of stored (encoded) bytes for the raw read and the tier read alone.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from kvgate.tools.bench.pagecache import PageCache, files_under

READ_BLOCK = 8 << 20


@dataclass
class LoadTimes:
    """Seconds per repeat of each measurement, and the decoded bytes one chunk load yields."""

    disk_s: list[float] = field(default_factory=list)  # store.get_many, memory tier cleared
    ram_s: list[float] = field(default_factory=list)  # store.get_many, served by the memory tier
    get_s: list[float] = field(default_factory=list)  # DiskTier.get alone
    decode_s: list[float] = field(default_factory=list)  # decode_chunk alone
    raw_s: list[float] = field(default_factory=list)  # plain read of one file of the same size
    decoded: int = 0


def time_chunk_loads(
    store: Any,
    memory: Any,
    disk: Any,
    hashes: Sequence[Any],
    snapshot: Sequence[tuple[Any, bytes]],
    disk_dir: Path,
    cache: PageCache,
    repeats: int,
) -> LoadTimes:
    """`repeats` times: the chunks of `hashes` from the disk tier (page cache dropped; they must be
    promoted into the memory tier), then from the memory tier, then the disk tier's reads and the
    decodes apart. `snapshot` is (key, encoded chunk) of the same chunks."""
    from kvgate.index.kv.chunks import decode_chunk

    out = LoadTimes()
    for _ in range(repeats):
        store.clear("memory")
        cache.drop(files_under(disk_dir))
        t0 = time.perf_counter()
        chunks = store.get_many(hashes)
        out.disk_s.append(time.perf_counter() - t0)
        if len(chunks) != len(hashes):
            raise RuntimeError(f"disk tier returned {len(chunks)} of {len(hashes)} chunks")
        out.decoded = sum(k.nbytes + v.nbytes for ch in chunks for k, v in ch)
        del chunks
        if not all(memory.contains(store.key(h)) for h in hashes):
            raise RuntimeError("chunks read from disk were not promoted into the memory tier")
        t0 = time.perf_counter()
        chunks = store.get_many(hashes)
        out.ram_s.append(time.perf_counter() - t0)
        if len(chunks) != len(hashes):
            raise RuntimeError("memory tier did not serve the chunks")
        del chunks
        cache.drop(files_under(disk_dir))  # the same read, split: tier reads, then decodes
        t0 = time.perf_counter()
        blobs = [(key, disk.get(key)) for key, _ in snapshot]
        out.get_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for key, data in blobs:
            decode_chunk(data, key)
        out.decode_s.append(time.perf_counter() - t0)
        del blobs
    return out


def time_raw_reads(
    raw_path: Path, snapshot: Sequence[tuple[Any, bytes]], cache: PageCache, repeats: int
) -> list[float]:
    """Write the encoded chunks of `snapshot` into one file, then time `repeats` sequential reads of
    it in READ_BLOCK blocks, the page cache dropped before each."""
    stored_bytes = sum(len(d) for _, d in snapshot)
    with open(raw_path, "wb") as f:
        for _, data in snapshot:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    raw_s: list[float] = []
    buf = bytearray(READ_BLOCK)
    for _ in range(repeats):
        cache.drop([raw_path])
        read = 0
        t0 = time.perf_counter()
        with open(raw_path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                read += n
        raw_s.append(time.perf_counter() - t0)
        if read != stored_bytes:
            raise RuntimeError(f"raw read {read} bytes of {stored_bytes}")
    return raw_s
