"""Loading chunks into the engine's blocks: one data path for the CPU and CUDA.

Per request: read its chunks (one round trip per tier), check each against this engine's blocks,
then per group of chunks that fits one staging buffer: pack their stored parts (raw, or the int8 /
int4 integers and scales) into a leased host buffer and move it with ONE host-to-device copy;
dequantize on the device; and finally write every layer with ONE scatter over an index of all the
request's target blocks. On the CPU the stored parts are already where the KV lives: no staging,
the same dequantize and scatter.

On CUDA the copies, dequantization and scatters run on the loader's own stream, which first waits
for the engine's stream; after each layer's scatter an event is recorded, and
`wait_for_layer(name)` makes the engine's stream wait for that layer only, so layer 0's attention
starts while later layers are still being written. A background loader (`layerwise=False`) waits
for its stream before returning instead.

A chunk that is missing, damaged or shaped unlike this engine's blocks stops the load there; its
blocks and every later one are reported as load errors, which vLLM recomputes. A failure while
writing reports all of the request's blocks: a half-written block is recomputed, never served.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Sequence

import torch

from kvgate.engines.vllm.kv_connector.gate import slowest
from kvgate.engines.vllm.kv_connector.paged import PagedKV
from kvgate.engines.vllm.kv_connector.specs import Counters, LoadSpec
from kvgate.engines.vllm.kv_connector.staging import StagingPool, groups_of, packed_offsets

log = logging.getLogger("vllm.kvgate")


class Loader:
    """Loads LoadSpecs into the paged KV; collects the block ids that failed."""

    def __init__(
        self,
        store: Any,
        kv: PagedKV,
        counters: Counters,
        pool: StagingPool | None = None,
        *,
        layerwise: bool = True,
        group_bytes: int = 64 << 20,
    ) -> None:
        self.store, self.kv, self.counters, self.pool = store, kv, counters, pool
        self.layerwise, self.group_bytes = layerwise, group_bytes
        self.failed: set[int] = set()
        self._lock = threading.Lock()
        self.stream = torch.cuda.Stream(device=kv.device) if kv.device.type == "cuda" else None
        self._ready: dict[str, Any] = {}  # layer name → event after its last scatter
        self._timing: list[tuple[Any, Any]] = []  # (start, end) events of device work not yet counted

    # ------------------------------------------------------------------ the request
    def load(self, spec: LoadSpec) -> int:
        """Load what verifies of `spec`; returns the chunks written."""
        t0 = time.perf_counter()
        served: list[str] = []
        try:
            chunks = self.store.get_many(spec.hashes, served, salt=spec.salt)
        except Exception:  # a tier that fails mid-read is a miss
            log.exception("reading KV chunks for request %s failed", spec.req_id)
            chunks = []
        good = self._verified(spec, chunks)
        try:
            if good:
                self._write(spec, good)
        except Exception:  # a half-written block is recomputed with the rest, never served
            log.exception("writing KV for request %s into the engine's blocks failed", spec.req_id)
            good = []
        self._account(spec, good, time.perf_counter() - t0, served[: len(good)])
        return len(good)

    def _verified(self, spec: LoadSpec, chunks: Sequence[Any]) -> list[Any]:
        good = []
        for i, chunk in enumerate(chunks):
            want = [self.kv.chunk_shape(len(spec.block_ids[i]))] * len(self.kv.layers)
            if list(chunk.shapes) != want or chunk.dtype != self.kv.dtype:
                log.warning(
                    "KV chunk %016x is %s %s, this engine's blocks %s %s: recomputing",
                    spec.hashes[i],
                    chunk.dtype,
                    chunk.shapes[:1],
                    self.kv.dtype,
                    want[:1],
                )
                break
            good.append(chunk)
        return good

    def _account(self, spec: LoadSpec, good: list[Any], host_s: float, served: list[str]) -> None:
        n = len(good)
        with self.counters.lock:
            self._count(spec, good, host_s, served)
        if n < len(spec.hashes):
            with self._lock:
                self.failed.update(spec.blocks_from(n))
            log.warning(
                "request %s: %d of %d KV chunks could not be loaded; vLLM recomputes them",
                spec.req_id,
                len(spec.hashes) - n,
                len(spec.hashes),
            )

    def _count(self, spec: LoadSpec, good: list[Any], host_s: float, served: list[str]) -> None:
        c = self.counters
        n = len(good)
        stored = sum(chunk.nbytes for chunk in good)
        c.loaded_chunks += n
        c.loaded_bytes += stored
        if n:
            tier = slowest(served, [t.name for t in getattr(self.store, "tiers", [])])
            sums = c.by_tier.setdefault(tier, [0.0, 0.0, 0.0])
            sums[0], sums[1], sums[2] = sums[0] + stored, sums[1] + n, sums[2] + host_s
        if spec.background:
            c.background_loads += 1
            c.background_load_s += host_s
        else:
            c.loads += 1
            c.load_s += host_s
        c.load_errors += len(spec.hashes) - n

    # ------------------------------------------------------------------ the data path
    def _write(self, spec: LoadSpec, good: list[Any]) -> None:
        kv = self.kv
        targets = [b for i in range(len(good)) for b in spec.block_ids[i][(spec.skip if i == 0 else 0) :]]
        if not targets:
            return
        stream = self.stream
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(kv.device))  # blocks may still be read by the last step
            start = torch.cuda.Event(enable_timing=True)
            start.record(stream)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            pieces = []
            for group in self._groups(good):
                for i, parts in self._on_device(good, group):
                    whole = good[i].expand(parts)
                    skip_rows = (spec.skip if i == 0 else 0) * kv.ratio
                    pieces.append(whole[:, skip_rows:] if skip_rows else whole)
            rows = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]
            idx = kv.index(targets)
            for name, layer, r in zip(kv.names, kv.layers, rows.unbind(0)):
                kv.write(layer, idx, r)
                if stream is not None and self.layerwise:
                    event = torch.cuda.Event()
                    event.record(stream)
                    self._ready[name] = event
        if stream is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record(stream)
            if self.layerwise:
                self._timing.append((start, end))
            else:  # the caller's clock then covers the device work too
                end.synchronize()

    def _groups(self, good: list[Any]) -> list[list[int]]:
        """Chunk indices in runs whose stored bytes fit one staging copy (all at once on the CPU)."""
        if self.stream is None:
            return [list(range(len(good)))]
        return groups_of([sum(p.numel() * p.element_size() for p in chunk.parts) for chunk in good], self.group_bytes)

    def _on_device(self, good: list[Any], group: list[int]) -> list[tuple[int, list[torch.Tensor]]]:
        """Each chunk's stored parts on the KV's device: one staged copy for the whole group."""
        chunks = [list(good[i].parts) for i in group]
        if self.stream is None:
            return list(zip(group, chunks))
        flat = [p for parts in chunks for p in parts]
        offsets, total = packed_offsets([p.numel() * p.element_size() for p in flat])
        lease = self.pool.lease(total) if self.pool is not None else None
        if lease is None:  # no room: pageable copies (slower, still correct)
            self.counters.unstaged_copies += 1
            return [(i, [p.to(self.kv.device) for p in parts]) for i, parts in zip(group, chunks)]
        for p, off in zip(flat, offsets):
            lease.view(off, p.shape, p.dtype).copy_(p)
        dev = lease.host.to(self.kv.device, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(self.stream)
        lease.release(copied)
        views = iter(
            dev[off : off + p.numel() * p.element_size()].view(p.dtype).view(p.shape) for p, off in zip(flat, offsets)
        )
        return [(i, [next(views) for _ in parts]) for i, parts in zip(group, chunks)]

    # ------------------------------------------------------------------ the engine's side
    def wait_for_layer(self, name: str) -> None:
        """The engine's stream waits for layer `name`'s scatter (nothing to wait for on the CPU)."""
        event = self._ready.pop(name, None)
        if event is not None:
            torch.cuda.current_stream(self.kv.device).wait_event(event)

    def finish_step(self) -> None:
        """After the forward pass: nothing of this step's loads stays unordered with the engine's
        stream, and device time of completed loads is counted."""
        if self.stream is None:
            return
        self._ready.clear()
        torch.cuda.current_stream(self.kv.device).wait_stream(self.stream)
        pending = []
        for start, end in self._timing:
            if end.query():
                self.counters.load_s += start.elapsed_time(end) / 1e3
            else:
                pending.append((start, end))
        self._timing = pending

    def fail(self, spec: LoadSpec) -> None:
        """Report every block of `spec` failed (whatever broke outside the load itself)."""
        with self._lock:
            self.failed.update(spec.blocks_from(0))
        self.counters.load_errors += len(spec.hashes)

    def take_failed(self) -> set[int]:
        with self._lock:
            out, self.failed = self.failed, set()
        return out
