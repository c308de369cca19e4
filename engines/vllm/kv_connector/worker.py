"""The worker side: copies between vLLM's paged KV and chunks, and the background saver.

vLLM hands the connector one tensor per attention layer, blocks first ([num_blocks, ...], the
standardized per-layer view). A chunk is, per layer, the rows of its blocks. Saving copies those
rows out right after the forward pass (a CPU copy, or a device-to-pinned-host copy on a GPU,
ordered by a CUDA event) and hands them to one background thread that quantizes, encodes and
writes them to every tier: the forward path pays only the copy. When the writer falls behind by
`save_queue` chunks, new saves are dropped and counted (a later request recomputes; decoding never
waits). Loading reads a request's chunks (one round trip per tier), dequantizes on the KV's device
and writes the rows in place; a chunk that is missing, damaged or shaped unlike this engine's
blocks stops the load there and its blocks are reported as load errors, which vLLM recomputes.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

log = logging.getLogger("vllm.kvgate")


@dataclass
class LoadSpec:
    req_id: str
    hashes: list[int]  # chunk hashes, in order
    block_ids: list[list[int]]  # per chunk, the engine blocks its rows go to
    skip: int  # rows of the first chunk the engine already holds

    def blocks_from(self, chunk: int) -> list[int]:
        """The engine blocks this load writes, from chunk `chunk` on (those it then leaves to recompute)."""
        return [b for i, ids in enumerate(self.block_ids[chunk:], start=chunk) for b in ids[(self.skip if i == 0 else 0):]]


@dataclass
class SaveSpec:
    chunk_hash: int
    block_hashes: list[int]  # every block of the chunk (what the events announce)
    block_ids: list[int]


@dataclass
class Counters:
    loads: int = 0
    loaded_chunks: int = 0
    loaded_bytes: int = 0
    load_s: float = 0.0
    load_errors: int = 0  # chunks missing, damaged or misshapen at load time (recomputed)
    saved_chunks: int = 0
    dropped_saves: int = 0
    save_copy_s: float = 0.0  # time on the forward path (the copy out)
    save_write_s: float = 0.0  # time in the background writer


class PagedKV:
    """The engine's per-layer KV tensors; gather and scatter of whole blocks."""

    def __init__(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if not kv_caches:
            raise ValueError("vLLM registered no KV caches")
        self.names = list(kv_caches)
        self.layers = [kv_caches[n] for n in self.names]
        first = self.layers[0]
        for name, t in zip(self.names, self.layers):
            if not isinstance(t, torch.Tensor) or t.shape != first.shape or t.dtype != first.dtype:
                raise ValueError(f"layer {name}: KV caches of different shapes or types ({tuple(t.shape)}) "
                                 "are not supported by kvgate's connector (hybrid or per-layer layouts)")
        self.device = first.device
        self.dtype = first.dtype
        self.block_shape = tuple(first.shape[1:])
        self.block_bytes = first[0].numel() * first.element_size() * len(self.layers)

    def gather(self, block_ids: Sequence[int]) -> tuple[list[torch.Tensor], Any]:
        """Copies of the blocks' rows, per layer, on the CPU; and what to wait on before reading them
        (a CUDA event on a GPU, None on the CPU)."""
        idx = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
        if self.device.type == "cpu":
            return [kv.index_select(0, idx) for kv in self.layers], None
        out = []
        for kv in self.layers:
            rows = kv.index_select(0, idx)
            host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
            host.copy_(rows, non_blocking=True)
            out.append(host)
        done = torch.cuda.Event()
        done.record()
        return out, done

    def scatter(self, rows: list[torch.Tensor], block_ids: Sequence[int]) -> None:
        idx = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
        for kv, r in zip(self.layers, rows):
            kv.index_copy_(0, idx, r)


class Saver:
    """One background writer: put_many of each gathered chunk, then `on_stored(spec)`."""

    def __init__(self, store: Any, depth: int, counters: Counters, on_stored: Callable[[SaveSpec], None]) -> None:
        self._store, self._counters, self._on_stored = store, counters, on_stored
        self._q: queue.Queue[tuple[SaveSpec, list[torch.Tensor], Any] | None] = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name="kvgate-kv-saver", daemon=True)
        self._thread.start()

    def submit(self, spec: SaveSpec, rows: list[torch.Tensor], done: Any) -> bool:
        try:
            self._q.put_nowait((spec, rows, done))
            return True
        except queue.Full:
            self._counters.dropped_saves += 1
            return False

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            spec, rows, done = item
            t0 = time.perf_counter()
            try:
                if done is not None:
                    done.synchronize()
                self._store.put_many([spec.chunk_hash], [rows])
                self._counters.saved_chunks += 1
                self._on_stored(spec)
            except Exception:  # a failing tier costs a later recompute, never the engine
                log.exception("saving a KV chunk failed")
            finally:
                self._counters.save_write_s += time.perf_counter() - t0
                self._q.task_done()

    def drain(self) -> None:
        self._q.join()

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)


@dataclass
class Loader:
    """Loads LoadSpecs into the paged KV; collects the block ids that failed."""

    store: Any
    kv: PagedKV
    counters: Counters
    failed: set[int] = field(default_factory=set)

    def load(self, spec: LoadSpec) -> None:
        t0 = time.perf_counter()
        chunks = self.store.get_many(spec.hashes)
        self.counters.loads += 1
        good = 0
        for i, chunk in enumerate(chunks):
            skip = spec.skip if i == 0 else 0
            targets = spec.block_ids[i][skip:]
            want = [(len(spec.block_ids[i]), *self.kv.block_shape)] * len(self.kv.layers)
            if list(chunk.shapes) != want or chunk.dtype != self.kv.dtype:
                log.warning("KV chunk %016x is %s %s, this engine's blocks %s %s: recomputing", spec.hashes[i],
                            chunk.dtype, chunk.shapes[:1], self.kv.dtype, self.kv.block_shape)
                break
            try:
                rows = chunk.tensors(self.kv.device)
                if targets:
                    self.kv.scatter([r[skip:] for r in rows], targets)
            except Exception:  # a half-written block is recomputed with the rest, never served
                log.exception("writing KV chunk %016x into the engine's blocks failed", spec.hashes[i])
                break
            self.counters.loaded_bytes += chunk.nbytes
            good += 1
        self.counters.loaded_chunks += good
        if good < len(spec.hashes):
            self.failed.update(spec.blocks_from(good))
            self.counters.load_errors += len(spec.hashes) - good
            log.warning("request %s: %d of %d KV chunks could not be loaded; vLLM recomputes them",
                        spec.req_id, len(spec.hashes) - good, len(spec.hashes))
        self.counters.load_s += time.perf_counter() - t0

    def take_failed(self) -> set[int]:
        out, self.failed = self.failed, set()
        return out
