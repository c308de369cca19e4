"""One shape of `kvgate bench kv-gpu`: prefill the Llama-shaped model into vLLM-layout KV caches,
save the history through the connector's Saver into kvgate's chunk store (memory and disk tiers,
each codec), then per tier, codec and history length load it back through the connector's Loader
and time it against the prefill it replaces; the gate decides each cell from the estimates it
would have had by then (cold defaults, then this run's own measurements, in order)."""

from __future__ import annotations

import math
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from kvgate.engines.vllm.kv_connector.gate import Estimates, chunks_worth_loading
from kvgate.engines.vllm.kv_connector.paged import PagedKV
from kvgate.engines.vllm.kv_connector.staging import StagingPool
from kvgate.engines.vllm.kv_connector.step_save import writer_depth
from kvgate.engines.vllm.kv_connector.worker import Counters, Loader, LoadSpec, SaveSpec
from kvgate.index.kv.chunks import ChunkStore, DiskTier, MemoryTier
from kvgate.index.kv.chunks.layer_codec import LayerCodec
from kvgate.tools.bench.kv_gpu_breakdown import load_breakdown
from kvgate.tools.bench.kv_gpu_model import Model, Shape, kv_caches, sync
from kvgate.tools.bench.kv_gpu_save import save_path_cost, store_history
from kvgate.tools.bench.pagecache import PageCache, files_under

BLOCK = 16  # vLLM's GPU block size


@dataclass
class Plan:
    histories: list[int]
    codecs: list[str]
    suffix: int
    reps: int
    chunk_blocks: int
    workdir: Path
    page_cache: PageCache
    deadline: float  # time.monotonic() after which remaining cells are skipped
    staging_bytes: int = 2048 << 20  # the connector's default staging_mb
    save_queue: int = 64  # the connector's default
    h2d_gbps: float | None = None  # pinned host-to-device speed measured in this run


@dataclass
class ShapeResult:
    cells: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    save_path: dict[str, Any] | None = None  # at 8192 tokens, or the longest history below it in a short run
    steady_allocs: int = 0
    raw_exact: bool = True


def gbps(nbytes: float, seconds: float) -> float:
    """GB/s to 4 significant figures (a CPU run's figures are thousandths, a GPU's tens)."""
    return float(f"{nbytes / seconds / 1e9:.4g}")


def timed(fn: Callable[[], Any], device: torch.device, reps: int) -> tuple[float, Any]:
    """Median seconds of `reps` runs after one warm-up, and the last run's result."""
    out = fn()
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def run_shape(shape: Shape, device: torch.device, plan: Plan) -> ShapeResult:
    res = ShapeResult()
    dtype = torch.bfloat16
    longest = max(plan.histories)
    total = longest + plan.suffix
    cb = plan.chunk_blocks
    src_blocks = -(-total // BLOCK)
    num_blocks = src_blocks + longest // BLOCK
    kv = PagedKV(kv_caches(shape, num_blocks, BLOCK, device, dtype), num_blocks)
    model = Model(shape, device, dtype)
    tokens = torch.randint(0, 1 << 15, (total,), device=device)
    slots = torch.arange(total, device=device)
    pool = StagingPool(plan.staging_bytes, pinned=device.type == "cuda")
    save_stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
    group_bytes = plan.staging_bytes // 4  # as the connector sizes its groups
    n_chunks = longest // (BLOCK * cb)
    specs = [SaveSpec(c + 1, [c + 1], list(range(c * cb, (c + 1) * cb))) for c in range(n_chunks)]
    depth = writer_depth(plan.save_queue, plan.staging_bytes, kv.block_bytes * cb, device.type == "cuda")

    # cold prefill of each history + suffix
    prefill: dict[int, float] = {}
    for h in plan.histories:
        prefill[h], _ = timed(lambda: model.forward(tokens[: h + plan.suffix]), device, plan.reps)
    at = max([h for h in plan.histories if h <= 8192] or [min(plan.histories)])  # 8k, or the nearest below
    scratch = ChunkStore(
        [MemoryTier(1 << 40), DiskTier(plan.workdir / "save-path", 1 << 40)], shape.name, LayerCodec("int8")
    )
    try:  # before the longest prefill below: that one leaves the KV the loads compare against
        res.save_path = save_path_cost(
            model,
            kv,
            scratch,
            pool,
            save_stream,
            tokens[:at],
            specs[: at // (BLOCK * cb)],
            plan.reps,
            group_bytes,
            depth,
        )
    finally:
        scratch.close()
        shutil.rmtree(plan.workdir / "save-path", ignore_errors=True)
    past = model.forward(tokens, kv_out=kv.layers, slots=slots)  # blocks 0.. hold the longest history
    sync(device)
    suffix_s = {
        h: timed(
            lambda: model.forward(tokens[h : h + plan.suffix], past=[(k[:, :h], v[:, :h]) for k, v in past]),
            device,
            plan.reps,
        )[0]
        for h in plan.histories
    }
    past = None  # freed before the loads

    for codec in plan.codecs:
        if time.monotonic() > plan.deadline:
            res.skipped.append(f"{shape.name} {codec}: over the time budget")
            continue
        disk_dir = plan.workdir / f"{shape.name}-{codec}"
        memory, disk = MemoryTier(1 << 40), DiskTier(disk_dir, 1 << 40)
        both = ChunkStore([memory, disk], f"{shape.name}:{codec}", LayerCodec(codec))  # type: ignore[arg-type]
        store_history(kv, both, pool, save_stream, specs, group_bytes)
        for tier, store in (
            ("memory", ChunkStore([memory], f"{shape.name}:{codec}", LayerCodec(codec))),  # type: ignore
            ("disk", ChunkStore([disk], f"{shape.name}:{codec}", LayerCodec(codec))),
        ):  # type: ignore
            # the engine measured its prefill on the steps that computed what it stored
            est = Estimates()
            est.observe_prefill(total, prefill[longest])
            for h in plan.histories:
                if time.monotonic() > plan.deadline:
                    res.skipped.append(f"{shape.name} {tier} {codec} {h}: over the time budget")
                    continue
                try:
                    cell = load_cell(
                        shape, kv, store, pool, plan, tier, codec, h, prefill[h], suffix_s[h], est, disk_dir
                    )
                except Exception as e:  # one broken cell must not cost the run's other figures
                    res.skipped.append(f"{shape.name} {tier} {codec} {h}: {type(e).__name__}: {e}")
                    continue
                res.raw_exact &= cell.pop("exact", True)
                res.steady_allocs += cell["steady_allocs"]
                res.cells.append(cell)
        both.close()
        shutil.rmtree(disk_dir, ignore_errors=True)
    return res


def load_cell(
    shape: Shape,
    kv: PagedKV,
    store: ChunkStore,
    pool: StagingPool,
    plan: Plan,
    tier: str,
    codec: str,
    h: int,
    prefill_s: float,
    suffix_s: float,
    est: Estimates,
    disk_dir: Path,
) -> dict[str, Any]:
    cb = plan.chunk_blocks
    n = h // (BLOCK * cb)
    base = -(-(max(plan.histories) + plan.suffix) // BLOCK)  # the destination blocks follow the source's
    spec = LoadSpec(
        "bench", list(range(1, n + 1)), [list(range(base + c * cb, base + (c + 1) * cb)) for c in range(n)], 0
    )
    counters = Counters()
    loader = Loader(store, kv, counters, pool, group_bytes=plan.staging_bytes // 4)
    gate_estimate = est.costs(tier)  # what the gate knew before this cell
    chunk_bytes = 0.0
    times = []
    assert loader.load(spec) == n, "a stored chunk did not load"  # warm-up, untimed
    loader.finish_step()
    sync(kv.device)
    allocs_after_first = pool.allocs  # the repeats of a warm load must allocate nothing
    for _ in range(plan.reps):
        if tier == "disk":
            plan.page_cache.drop(files_under(disk_dir))
        before = counters.loaded_bytes
        sync(kv.device)
        t0 = time.perf_counter()
        assert loader.load(spec) == n, "a stored chunk did not load"
        loader.finish_step()
        sync(kv.device)
        times.append(time.perf_counter() - t0)
        chunk_bytes = (counters.loaded_bytes - before) / max(1, n)
    load_s = statistics.median(times)
    moved = chunk_bytes * n
    exact, err = compare(kv, n * cb, base)
    choice = "load" if chunks_worth_loading(n, BLOCK * cb, chunk_bytes, gate_estimate) == n else "prefill"
    est.observe_load(moved, n, load_s, tier)
    est.observe_prefill(h + plan.suffix, prefill_s)
    with_load = load_s + suffix_s
    stages = load_breakdown(
        store,
        kv,
        spec,
        pool,
        plan.staging_bytes // 4,
        plan.h2d_gbps,
        plan.page_cache,
        disk_dir if tier == "disk" else None,
    )
    return {
        "shape": shape.name,
        "tier": tier,
        "codec": codec,
        "history_tokens": h,
        "load_gbps_bf16_equiv": gbps(h * shape.kv_bytes_per_token, load_s),
        "load_gbps_moved": gbps(moved, load_s),
        "load_s": round(load_s, 5),
        "prefill_s": round(prefill_s, 5),
        "suffix_s": round(suffix_s, 5),
        "load_plus_suffix_s": round(with_load, 5),
        "gate_choice": choice,
        "gate_s": round(with_load if choice == "load" else prefill_s, 5),
        "best_s": round(min(prefill_s, with_load), 5),
        "max_abs_err": err,
        "gate_estimate": {
            "load_gbps": gbps(gate_estimate.load_bytes_per_s, 1.0),
            "prefill_tokens_per_s": round(gate_estimate.prefill_tokens_per_s),
        },
        "breakdown_s": stages,
        "steady_allocs": pool.allocs - allocs_after_first,
        "exact": exact if codec == "raw" else True,
    }


def compare(kv: PagedKV, n_blocks: int, base: int) -> tuple[bool, float]:
    """Whether blocks base.. hold exactly blocks 0.. (the saved KV), and the largest difference."""
    src, dst = kv.index(list(range(n_blocks))), kv.index(list(range(base, base + n_blocks)))
    exact, err = True, 0.0
    for layer in kv.layers:
        a, b = kv.read(layer, src), kv.read(layer, dst)
        exact &= bool(torch.equal(a, b))
        err = max(err, float((a.float() - b.float()).abs().max()))
    return exact, round(err, 5) if math.isfinite(err) else err
