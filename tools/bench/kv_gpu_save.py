"""The save side of `kvgate bench kv-gpu`: storing a history through the connector's own StepSave
and Saver, and what saving costs the forward pass.

The forward-path cost is measured, not inferred: the same prefill is timed plain, with the copies
alone (a writer that gives each chunk back at once: what the copy-out itself costs), and with the
connector's own `Saves` and background writer (each layer's copy started right after that layer,
as vLLM calls save_kv_layer; then the hand-off and the engine's stream waiting for the copies, as
wait_for_save does), to the end of the device work. The saving runs go back to back, so the
writer's work for one step overlaps the next step's forward pass, as under load.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from kvgate.engines.vllm.kv_connector.staging import StagingPool
from kvgate.engines.vllm.kv_connector.step_save import Saves, StepSave
from kvgate.engines.vllm.kv_connector.worker import Counters, PagedKV, Saver, SaveSpec
from kvgate.tools.bench.kv_gpu_model import sync


def _seconds(fn: Callable[[], Any], device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def store_history(
    kv: PagedKV, store: Any, pool: StagingPool, stream: Any, specs: list[SaveSpec], group_bytes: int, batch: int = 64
) -> None:
    """Save every chunk of `specs` (all must land: the loads read them back), `batch` at a time."""
    saver = Saver(store, batch + 1, Counters(), lambda spec: None)
    try:
        for i in range(0, len(specs), batch):
            step = StepSave(kv, specs[i : i + batch], pool, stream, group_bytes)
            assert not step.dropped, "the staging pool cannot hold one batch of chunks"
            for spec, rows, done in step.finish():
                assert saver.submit(spec, rows, done)
            saver.drain()
    finally:
        saver.close()


class _Discard:
    """A writer that gives each chunk's staging back at once: the copies out alone."""

    def submit(self, spec: SaveSpec, rows: list[torch.Tensor], done: Any) -> bool:
        done.release()
        return True


def save_path_cost(
    model: Any,
    kv: PagedKV,
    store: Any,
    pool: StagingPool,
    stream: Any,
    tokens: torch.Tensor,
    specs: list[SaveSpec],
    reps: int,
    group_bytes: int,
    depth: int,
) -> dict[str, Any]:
    """The prefill of `tokens` (writing its KV into blocks 0..) timed plain and with the saves of
    `specs` through the connector's own `Saves`; the fraction is the median difference over the
    plain median."""
    device = kv.device
    slots = torch.arange(tokens.numel(), device=device)
    counters = Counters()
    saver = Saver(store, depth, counters, lambda spec: None)

    def plain() -> None:
        model.forward(tokens, kv_out=kv.layers, slots=slots)

    def step(saves: Saves) -> Callable[[], None]:
        def run() -> None:  # what vLLM calls around one forward pass
            saves.begin(specs)
            model.forward(tokens, kv_out=kv.layers, slots=slots, after_layer=lambda i: saves.layer(kv.names[i]))
            saves.end()

        return run

    copying = step(Saves(kv, pool, stream, group_bytes, _Discard(), Counters()))
    saving = step(Saves(kv, pool, stream, group_bytes, saver, counters))
    try:
        plain()
        base = [_seconds(plain, device) for _ in range(reps)]
        copying()
        copy_only = [_seconds(copying, device) for _ in range(reps)]
        saving()
        saver.drain()
        launched = counters.save_copy_s
        with_save = [_seconds(saving, device) for _ in range(reps)]
        saver.drain()
    finally:
        saver.close()
    b, w, c = statistics.median(base), statistics.median(with_save), statistics.median(copy_only)
    return {
        "history_tokens": tokens.numel(),
        "chunks": len(specs),
        "forward_s": round(b, 5),
        "forward_with_save_s": round(w, 5),
        "fraction": round((w - b) / b, 4),
        "forward_with_copy_only_s": round(c, 5),
        "copy_only_fraction": round((c - b) / b, 4),
        "host_launch_s_per_step": round((counters.save_copy_s - launched) / reps, 5),
        "dropped_chunks": counters.dropped_saves,
        "saved_chunks": counters.saved_chunks,
        "writer_s_per_chunk": round(counters.save_write_s / max(1, counters.saved_chunks), 6),
    }
