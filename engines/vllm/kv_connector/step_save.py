"""Copying one step's chunks to save out of the paged KV, layer by layer, as the forward pass ends
each layer.

vLLM calls save_kv_layer right after an attention layer wrote its KV. On CUDA the copy of that
layer's rows starts there, on the save stream (which first waits for the engine's stream): one
gather and one device-to-host copy per layer per group of chunks, into one staging buffer per
group. The copies then overlap the later layers' compute, and when the forward pass ends only the
last layer's copy is outstanding. `finish` copies any layer that was not copied yet (a mode or
backend that skips save_kv_layer) and hands back, per chunk, its rows per layer (views of the
group's buffer) and what to wait on before reading them. On the CPU the copies are plain
index_selects, one per layer per group.

On CUDA a group that finds no free staging buffer is not saved (its chunks are counted dropped):
pinning fresh memory on the forward path would cost more than the copy, and a full pool means the
background writer is behind anyway.

Invariants: a chunk's rows are copies of its blocks as the forward pass left them (each layer is
copied after that layer's own write); a group's chunks share one staging buffer, which goes back
to the pool when the last of them is released; a group never needs more than `group_bytes` of
staging (a chunk larger than that is a group of its own).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from kvgate.engines.vllm.kv_connector.paged import PagedKV
from kvgate.engines.vllm.kv_connector.specs import Counters, SaveSpec
from kvgate.engines.vllm.kv_connector.staging import Lease, StagingPool, groups_of, packed_offsets

log = logging.getLogger("vllm.kvgate")


def writer_depth(save_queue: int, staging_bytes: int, chunk_bytes: int, cuda: bool) -> int:
    """Chunks the background writer may hold queued: `save_queue`, and on CUDA at least as many as
    the staging pool holds (each queued chunk keeps its staging there, so the pool bounds the
    queue). Invariant: >= save_queue."""
    return max(save_queue, staging_bytes // max(1, chunk_bytes) if cuda else 0)


class SharedCopy:
    """Device-to-host copies of one group in flight, shared by its chunks: `wait` before reading
    a chunk's rows, `release` once per chunk after; the buffer goes back with the last release."""

    def __init__(self, lease: Lease | None, users: int) -> None:
        self.event: Any = None
        self.lease, self._users = lease, users
        self._lock = threading.Lock()

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last and self.lease is not None:
            self.lease.release(self.event)


@dataclass
class _Group:
    specs: list[SaveSpec]
    starts: list[int]  # first row of each chunk in the group's rows
    idx: torch.Tensor
    lease: Lease | None
    offsets: list[int]  # of each layer's rows in the lease
    host: list[torch.Tensor | None] = field(default_factory=list)  # per layer, once copied


class StepSave:
    """One step's saves: `layer(name)` after each layer's forward, then `finish()`."""

    def __init__(
        self,
        kv: PagedKV,
        specs: Sequence[SaveSpec],
        pool: StagingPool | None = None,
        stream: Any = None,
        group_bytes: int = 64 << 20,
    ) -> None:
        self.kv, self.pool, self.stream = kv, pool, stream
        self.cuda = kv.device.type == "cuda"
        self.dropped = 0  # chunks not saved: no staging buffer was free for their group
        self._index = {name: i for i, name in enumerate(kv.names)}
        row_bytes = math.prod(kv.row_shape) * kv.dtype.itemsize
        rows = [len(kv.rows(s.block_ids)) for s in specs]
        self._groups: list[_Group] = []
        for run in groups_of([r * row_bytes * len(kv.layers) for r in rows], group_bytes):
            chosen = [specs[i] for i in run]
            starts = [0]
            for i in run:
                starts.append(starts[-1] + rows[i])
            offsets, total = packed_offsets([starts[-1] * row_bytes] * len(kv.layers))
            lease = pool.lease(total) if self.cuda and pool is not None else None
            if self.cuda and lease is None:
                self.dropped += len(chosen)
                continue
            with self._on_stream():
                idx = kv.index([b for s in chosen for b in s.block_ids])
            self._groups.append(_Group(chosen, starts, idx, lease, offsets, [None] * len(kv.layers)))

    def _on_stream(self) -> Any:
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def layer(self, name: str) -> None:
        """Start copying layer `name` out (after its forward wrote it). Unknown names are ignored."""
        i = self._index.get(name)
        if i is not None:
            self._copy(i)

    def _copy(self, i: int) -> None:
        kv, layer = self.kv, self.kv.layers[i]
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(kv.device))  # the forward wrote this layer there
        with self._on_stream():
            for g in self._groups:
                if g.host[i] is not None:
                    continue
                rows = kv.read(layer, g.idx)
                if not self.cuda:
                    g.host[i] = rows.contiguous()
                    continue
                assert g.lease is not None  # a CUDA group without one was dropped
                dest = g.lease.view(g.offsets[i], (g.starts[-1], *kv.row_shape), kv.dtype)
                dest.copy_(rows, non_blocking=True)
                g.host[i] = dest

    def finish(self) -> list[tuple[SaveSpec, list[torch.Tensor], SharedCopy]]:
        """Copy what is left; per chunk its spec, rows per layer, and the shared copy to wait on."""
        for i in range(len(self.kv.layers)):
            if any(g.host[i] is None for g in self._groups):
                self._copy(i)
        out = []
        for g in self._groups:
            share = SharedCopy(g.lease, len(g.specs))
            if self.cuda:
                share.event = torch.cuda.Event()
                share.event.record(self.stream or torch.cuda.current_stream(self.kv.device))
            for k, spec in enumerate(g.specs):
                a, b = g.starts[k], g.starts[k + 1]
                out.append((spec, [h[a:b] for h in g.host if h is not None], share))
        return out

    def abandon(self) -> None:
        """Give every staging buffer back (a failed step: nothing of it is saved), once the copies
        already started into it are done."""
        event = None
        if self.cuda and any(g.lease is not None for g in self._groups):
            event = torch.cuda.Event()
            event.record(self.stream or torch.cuda.current_stream(self.kv.device))
        for g in self._groups:
            if g.lease is not None:
                g.lease.release(event)
                g.lease = None


def copy_out(
    kv: PagedKV, specs: Sequence[SaveSpec], pool: StagingPool | None = None, stream: Any = None
) -> list[tuple[SaveSpec, list[torch.Tensor], SharedCopy]]:
    """All layers of `specs` at once (what a step whose layers were not announced does)."""
    return StepSave(kv, specs, pool, stream).finish()


class Saves:
    """The worker's saves, step after step: a StepSave for each step with chunks to save, started
    at the first save_kv_layer, finished in wait_for_save. Never raises into the forward pass: a
    failure drops that step's saves (logged)."""

    def __init__(
        self, kv: PagedKV, pool: StagingPool | None, stream: Any, group_bytes: int, saver: Any, counters: Counters
    ) -> None:
        self.kv, self.pool, self.stream, self.group_bytes = kv, pool, stream, group_bytes
        self.saver, self.counters = saver, counters
        self._specs: Sequence[SaveSpec] = ()  # this step's chunks to save
        self._step: StepSave | bool | None = None  # None: not started this step; False: nothing to save

    def begin(self, specs: Sequence[SaveSpec]) -> None:
        """A new step, saving `specs`: copies of a step that ended without `end` are not saved."""
        if self._step:
            self._step.abandon()
        self._specs, self._step = specs, None

    def layer(self, name: str) -> None:
        if self._step is None:
            self._step = self._start()
        if self._step:
            t0 = time.perf_counter()
            try:
                self._step.layer(name)
            except Exception:
                log.exception("copying KV out for saving failed")
                self._step.abandon()
                self._step = False
            self.counters.save_copy_s += time.perf_counter() - t0

    def end(self) -> None:
        """Copy what is left, hand every chunk to the writer, order the engine's stream after the
        copies (a block freed after this step is rewritten only once copied out)."""
        step, self._step = self._step, None
        if step is None:
            step = self._start()
        if not step:
            return
        t0 = time.perf_counter()
        try:
            chunks = step.finish()
        except Exception:
            log.exception("copying KV out for saving failed")
            step.abandon()
            chunks = []
        self.counters.dropped_saves += step.dropped
        for spec, rows, done in chunks:
            self.saver.submit(spec, rows, done)
        if self.stream is not None:
            torch.cuda.current_stream(self.kv.device).wait_stream(self.stream)
        self.counters.save_copy_s += time.perf_counter() - t0

    def _start(self) -> StepSave | bool:
        if not self._specs:
            return False
        try:
            return StepSave(self.kv, self._specs, self.pool, self.stream, self.group_bytes)
        except Exception:
            log.exception("copying KV out for saving failed")
            return False
