"""The connector's worker data path without vLLM: layouts vLLM registers, the staging pool, batched
loads (one scatter per layer per request), background loads, and the load-or-recompute gate."""

from __future__ import annotations

import math
import threading
from typing import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.engines.vllm.kv_connector.background import BackgroundLoads
from kvgate.engines.vllm.kv_connector.gate import (
    COLD,
    Costs,
    Estimates,
    chunks_worth_loading,
    ewma,
    in_background,
    load_seconds,
    prefill_seconds,
    slowest,
    weight,
)
from kvgate.engines.vllm.kv_connector.paged import PagedKV, block_axis
from kvgate.engines.vllm.kv_connector.settings import SettingsError, parse
from kvgate.engines.vllm.kv_connector.staging import StagingPool, groups_of, packed_offsets
from kvgate.engines.vllm.kv_connector.step_save import StepSave, copy_out
from kvgate.engines.vllm.kv_connector.worker import Counters, Loader, LoadSpec, SaveSpec
from kvgate.index.kv.chunks import ChunkStore, MemoryTier
from kvgate.index.kv.chunks.layer_codec import LayerCodec
from tests.test_vllm_connector_units import save

LAYERS, BLOCKS, HEADS, BS, HEAD = 3, 12, 2, 4, 32


def strided_views(order: tuple[int, ...], num_blocks: int = BLOCKS, ratio: int = 1) -> dict[str, torch.Tensor]:
    """Per-layer [B, H, N, C] views of one buffer laid out in `order` (vLLM's allocate_kv_cache)."""
    logical = (LAYERS, num_blocks * ratio, HEADS, BS, 2 * HEAD)
    physical = [logical[i] for i in order]
    raw = torch.randn(physical, dtype=torch.bfloat16)
    view = raw.permute(*[order.index(i) for i in range(5)])
    assert tuple(view.shape) == logical
    return {f"model.layers.{i}.self_attn.attn": view[i] for i in range(LAYERS)}


# -- layouts -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape, num_blocks, expect",
    [
        ((BLOCKS, HEADS, BS, 2 * HEAD), BLOCKS, (0, 1)),  # vLLM 0.32's [B, H, N, C]
        ((2 * BLOCKS, HEADS, BS // 2, 2 * HEAD), BLOCKS, (0, 2)),  # kernel blocks half the scheduler's
        ((2, BLOCKS, BS, HEADS, HEAD), BLOCKS, (1, 1)),  # FlashAttention's K/V-first
        ((BLOCKS, 2, BS, HEADS, HEAD), BLOCKS, (0, 1)),  # FlashInfer's
        ((2, BLOCKS, BS, HEADS, HEAD), None, (1, 1)),
        ((10, 2, 4, 8), None, (0, 1)),
    ],
)
def test_block_axis_of_the_layouts_vllm_registers(shape, num_blocks, expect) -> None:
    assert block_axis(shape, num_blocks) == expect


@pytest.mark.parametrize("shape", [(7, 2, 4, 8), (3,)])
def test_block_axis_refuses_an_unsupported_layout_naming_it(shape) -> None:
    with pytest.raises(ValueError, match=r"unsupported KV cache layout \[" + str(shape[0])):
        block_axis(shape, 5)


@pytest.mark.parametrize("order", [(0, 1, 2, 3, 4), (0, 1, 3, 2, 4), (1, 0, 2, 3, 4)])  # LBHNC, LBNHC, BLHNC
def test_copy_out_and_scatter_follow_any_stride_order(order) -> None:
    src, dst = PagedKV(strided_views(order), BLOCKS), PagedKV(strided_views(order), BLOCKS)
    _, rows, done = copy_out(src, [SaveSpec(1, [1], [3, 7])])[0]
    assert done.event is None and [tuple(r.shape) for r in rows] == [(2, HEADS, BS, 2 * HEAD)] * LAYERS
    dst.scatter(rows, [1, 9])
    assert all(torch.equal(d[1], s[3]) and torch.equal(d[9], s[7]) for d, s in zip(dst.layers, src.layers))


def test_kv_first_layout_and_kernel_block_ratio() -> None:
    kvf = PagedKV({f"l{i}": torch.randn(2, BLOCKS, BS, HEADS, HEAD) for i in range(2)}, BLOCKS)
    _, rows, _ = copy_out(kvf, [SaveSpec(1, [1], [5])])[0]
    assert tuple(rows[0].shape) == (1, 2, BS, HEADS, HEAD) and torch.equal(rows[0][0], kvf.layers[0][:, 5])
    split = PagedKV(strided_views((0, 1, 2, 3, 4), ratio=2), BLOCKS)
    assert split.rows([1, 4]) == [2, 3, 8, 9] and split.chunk_shape(2)[0] == 4


# -- saves, layer by layer -------------------------------------------------------------------------
def test_step_save_copies_each_layer_when_announced_and_the_rest_at_finish() -> None:
    kv = PagedKV(strided_views((0, 1, 3, 2, 4)), BLOCKS)
    specs = [SaveSpec(1, [1], [2]), SaveSpec(2, [2], [5, 6]), SaveSpec(3, [3], [9])]
    step = StepSave(kv, specs, group_bytes=1)  # one chunk per group
    names = kv.names
    before = [layer.clone() for layer in kv.layers]
    step.layer(names[0])
    step.layer("draft_model.layers.0.attn")  # not this engine's: ignored
    for layer in kv.layers:
        layer.add_(1)  # a later write: layer 0 was copied before it, the others are not yet
    out = step.finish()
    assert [spec.chunk_hash for spec, _, _ in out] == [1, 2, 3]
    for spec, rows, done in out:
        assert done.event is None and len(rows) == LAYERS
        for i, r in enumerate(rows):
            source = before[i] if i == 0 else kv.layers[i]
            assert torch.equal(r, torch.stack([source[b] for b in spec.block_ids]))


@settings(deadline=None)
@given(st.lists(st.integers(1, 50), max_size=20), st.integers(1, 80))
def test_groups_of_keep_order_and_bound(sizes: list[int], limit: int) -> None:
    runs = groups_of(sizes, limit)
    assert [i for run in runs for i in run] == list(range(len(sizes))) and all(runs)
    assert all(len(run) == 1 or sum(sizes[i] for i in run) <= limit for run in runs)


def test_a_shared_copy_gives_its_buffer_back_with_the_last_chunk() -> None:
    from kvgate.engines.vllm.kv_connector.step_save import SharedCopy

    pool = StagingPool(4 << 20, pinned=False)
    lease = pool.lease(1 << 20)
    share = SharedCopy(lease, 2)
    share.release()
    assert pool.lease(4 << 20) is None  # still held: only one of two chunks released
    share.release()
    assert pool.lease(1 << 20) is not None and pool.allocs == 1


def test_saves_store_each_step_and_a_failure_drops_only_that_step() -> None:
    from kvgate.engines.vllm.kv_connector.step_save import Saves
    from kvgate.engines.vllm.kv_connector.worker import Saver

    kv, counters, stored = PagedKV(strided_views((0, 1, 2, 3, 4)), BLOCKS), Counters(), []
    store = ChunkStore([MemoryTier(1 << 26)], "ns", LayerCodec("raw"))
    saver = Saver(store, 8, counters, stored.append)
    saves = Saves(kv, None, None, 1 << 20, saver, counters)
    try:
        step = [SaveSpec(1, [1], [2]), SaveSpec(2, [2], [3])]
        saves.begin(step)
        for name in kv.names[:2]:  # the last layer is left to end()
            saves.layer(name)
        saves.end()
        saves.begin([SaveSpec(3, [3], [BLOCKS + 5])])
        saves.layer(kv.names[0])  # no such block: this step is dropped
        saves.end()
        saves.begin([])
        saves.end()  # nothing to save
        saver.drain()
        assert [s.chunk_hash for s in stored] == [1, 2]
        got = store.get_many([1, 2])
        assert all(torch.equal(c.parts[0][i][0], kv.layers[i][b]) for c, b in zip(got, [2, 3]) for i in range(LAYERS))
    finally:
        saver.close()
        store.close()


# -- staging -----------------------------------------------------------------------------------------
def test_staging_pool_reuses_buffers_and_respects_capacity() -> None:
    pool = StagingPool(4 << 20, pinned=False)
    for _ in range(10):
        a, b = pool.lease(300_000), pool.lease(1 << 20)
        assert a is not None and b is not None and a.buffer.data_ptr() != b.buffer.data_ptr()
        a.release()
        b.release()
    assert pool.allocs == 2
    assert pool.lease(8 << 20) is None  # beyond capacity: the caller copies unstaged


class Copy:
    """A stand-in for a CUDA event: done or still in flight."""

    def __init__(self, done: bool) -> None:
        self.done, self.waited = done, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = self.done = True


def test_staging_pool_leases_a_finished_buffer_and_double_buffers_while_one_is_in_flight() -> None:
    pool = StagingPool(4 << 20, pinned=False)
    first = pool.lease(1 << 20)
    assert first is not None
    in_flight = Copy(done=False)
    first.release(in_flight)
    second = pool.lease(1 << 20)  # the first is still being copied: room for another, so a new one
    assert second is not None and second.buffer.data_ptr() != first.buffer.data_ptr() and pool.allocs == 2
    assert not in_flight.waited
    in_flight.done = True
    second.release()
    third = pool.lease(1 << 20)  # both finished now: reused, nothing allocated
    assert third is not None and pool.allocs == 2
    full = StagingPool(1 << 20, pinned=False)
    only = full.lease(1 << 20)
    assert only is not None
    busy = Copy(done=False)
    only.release(busy)
    again = full.lease(1 << 20)  # at capacity: the one in flight, after waiting for its copy
    assert again is not None and busy.waited and full.allocs == 1


def test_packed_offsets_are_aligned() -> None:
    offsets, total = packed_offsets([3, 64, 65, 1])
    assert offsets == [0, 64, 128, 256] and total == 320


# -- loads -------------------------------------------------------------------------------------------
@pytest.fixture(params=["raw", "int8", "int4"])
def store(request) -> Iterator[ChunkStore]:
    s = ChunkStore([MemoryTier(1 << 27)], "ns", LayerCodec(request.param))
    s.codec_name = request.param  # type: ignore[attr-defined]
    yield s
    s.close()


def near(got: torch.Tensor, want: torch.Tensor, codec: str) -> bool:
    """Within the codec's half step of the group's absmax (bounded here by the tensor's)."""
    tol = {"raw": 0.0, "int8": 0.05, "int4": 0.5}[codec]
    return bool((got.float() - want.float()).abs().max() <= tol * want.float().abs().max() + 1e-6)


def test_a_request_loads_with_one_scatter_per_layer(store: ChunkStore) -> None:
    src, dst = PagedKV(strided_views((0, 1, 3, 2, 4)), BLOCKS), PagedKV(strided_views((0, 1, 3, 2, 4)), BLOCKS)
    for layer in dst.layers:
        layer.zero_()
    save(store, src, [SaveSpec(1, [1], [0, 1]), SaveSpec(2, [2], [2, 3]), SaveSpec(3, [3], [4, 5])])
    writes = []
    original = dst.write
    dst.write = lambda layer, idx, rows: (writes.append(idx.tolist()), original(layer, idx, rows))  # type: ignore
    counters = Counters()
    loader = Loader(store, dst, counters, StagingPool(8 << 20, pinned=False))
    assert loader.load(LoadSpec("r", [1, 2, 3], [[6, 7], [8, 9], [10, 11]], skip=1)) == 3
    assert writes == [[7, 8, 9, 10, 11]] * LAYERS
    for d, s in zip(dst.layers, src.layers):
        assert not d[6].any()
        assert all(near(d[t], s[o], store.codec_name) for t, o in zip(range(7, 12), range(1, 6)))  # type: ignore
    assert loader.take_failed() == set() and counters.loaded_chunks == 3 and counters.loads == 1


def test_a_gap_fails_the_rest_of_the_request(store: ChunkStore) -> None:
    src, dst = PagedKV(strided_views((0, 1, 2, 3, 4)), BLOCKS), PagedKV(strided_views((0, 1, 2, 3, 4)), BLOCKS)
    save(store, src, [SaveSpec(1, [1], [0])])
    counters = Counters()
    loader = Loader(store, dst, counters)
    assert loader.load(LoadSpec("r", [1, 99, 1], [[4], [5], [6]], skip=0)) == 1
    assert loader.take_failed() == {5, 6} and counters.load_errors == 2


def test_background_loads_report_each_request_once_after_its_failures(store: ChunkStore) -> None:
    src, dst = PagedKV(strided_views((0, 1, 2, 3, 4)), BLOCKS), PagedKV(strided_views((0, 1, 2, 3, 4)), BLOCKS)
    save(store, src, [SaveSpec(1, [1], [2])])
    counters = Counters()
    bg = BackgroundLoads(Loader(store, dst, counters, layerwise=False))
    try:
        bg.submit(LoadSpec("ok", [1], [[3]], skip=0, background=True))
        bg.submit(LoadSpec("gap", [1, 77], [[4], [5]], skip=0, background=True))
        bg.drain()
        assert bg.take_finished() == {"ok", "gap"} and bg.take_finished() == set()
        assert bg.take_failed() == {5}
        assert counters.background_loads == 2 and counters.loads == 0
        assert all(
            torch.equal(d[3], d[4]) and near(d[3], s[2], store.codec_name)  # type: ignore[attr-defined]
            for d, s in zip(dst.layers, src.layers)
        )
    finally:
        bg.close()


def test_background_loads_survive_a_store_that_raises() -> None:
    class Broken:
        def get_many(self, hashes, served=None, salt=None):
            raise OSError("disk gone")

    kv = PagedKV(strided_views((0, 1, 2, 3, 4)), BLOCKS)
    bg = BackgroundLoads(Loader(Broken(), kv, Counters(), layerwise=False))
    try:
        bg.submit(LoadSpec("r", [1, 2], [[0], [1]], skip=0, background=True))
        bg.drain()
        assert bg.take_finished() == {"r"} and bg.take_failed() == {0, 1}
    finally:
        bg.close()


def test_cpu_saves_and_loads_allocate_no_staging() -> None:
    pool = StagingPool(1 << 24, pinned=False)
    kv = PagedKV(strided_views((0, 1, 2, 3, 4)), BLOCKS)
    _, rows, done = copy_out(kv, [SaveSpec(1, [1], [1, 2])], pool)[0]
    assert done.event is None and pool.allocs == 0


# -- gate --------------------------------------------------------------------------------------------
costs_st = st.builds(Costs, st.floats(1e6, 1e11), st.floats(0, 1e-2), st.floats(1e2, 1e6))


@settings(deadline=None)
@given(costs_st, st.integers(0, 64), st.integers(1, 4096), st.floats(1e3, 1e9))
def test_gate_loads_only_what_is_estimated_faster(costs: Costs, n: int, tokens: int, chunk_bytes: float) -> None:
    k = chunks_worth_loading(n, tokens, chunk_bytes, costs)
    assert 0 <= k <= n
    prefill = prefill_seconds(tokens * k, costs)  # summed in another order: equal up to rounding
    assert load_seconds(chunk_bytes * k, k, costs) <= prefill * (1 + 1e-9) + 1e-12


@given(costs_st, st.integers(1, 64), st.integers(1, 4096), st.floats(1e3, 1e9), st.floats(1.0, 10.0))
def test_gate_is_monotone_in_bandwidth_and_prefill_rate(costs, n, tokens, chunk_bytes, factor) -> None:
    k = chunks_worth_loading(n, tokens, chunk_bytes, costs)
    faster_tier = Costs(costs.load_bytes_per_s * factor, costs.per_chunk_s / factor, costs.prefill_tokens_per_s)
    slower_prefill = Costs(costs.load_bytes_per_s, costs.per_chunk_s, costs.prefill_tokens_per_s / factor)
    assert chunks_worth_loading(n, tokens, chunk_bytes, faster_tier) >= k
    assert chunks_worth_loading(n, tokens, chunk_bytes, slower_prefill) >= k
    assert chunks_worth_loading(n, tokens, chunk_bytes / factor, costs) >= k


@given(st.floats(-1e3, 1e3), st.floats(-1e3, 1e3), st.floats(0, 1))
def test_ewma_lies_between_old_and_new(old: float, new: float, alpha: float) -> None:
    assert min(old, new) - 1e-9 <= ewma(old, new, alpha) <= max(old, new) + 1e-9


@given(st.floats(0, 10), st.floats(0, 10), st.floats(-1, 10))
def test_background_is_monotone_in_the_estimate(a: float, b: float, threshold: float) -> None:
    lo, hi = sorted((a, b))
    assert in_background(hi, threshold) >= in_background(lo, threshold)
    assert in_background(1e-9, 0)


def test_the_first_measurement_replaces_the_cold_default() -> None:
    est = Estimates()
    est.observe_load(1e8, 1, 1.0 + COLD.per_chunk_s, "disk")
    est.observe_prefill(50_000, 1.0)
    assert math.isclose(est.costs("disk").load_bytes_per_s, 1e8) and est.prefill_tokens_per_s == 50_000
    est.observe_prefill(30_000, 1.0)  # the second is averaged evenly with it
    assert est.prefill_tokens_per_s == 40_000


@given(st.integers(0, 1000), st.floats(0.01, 1.0))
def test_weight_starts_at_one_and_never_falls_under_alpha(seen: int, alpha: float) -> None:
    assert weight(0, alpha) == 1.0 and alpha <= weight(seen, alpha) <= 1.0
    assert weight(seen + 1, alpha) <= weight(seen, alpha)


def test_estimates_move_from_cold_towards_measurements_per_tier() -> None:
    est = Estimates()
    for _ in range(100):
        est.observe_load(1e9, 10, 1.0 + 10 * COLD.per_chunk_s, "disk")
        est.observe_prefill(4000, 1.0)
    assert math.isclose(est.costs("disk").load_bytes_per_s, 1e9, rel_tol=1e-3)
    assert est.costs("remote").load_bytes_per_s == COLD.load_bytes_per_s  # never measured: cold
    assert math.isclose(est.costs("remote").prefill_tokens_per_s, 4000, rel_tol=1e-3)
    est.observe_load(0, 0, 0, "disk")  # nothing measured moves nothing
    assert est.gauges(["disk", "remote"]) == {
        "gate_load_gbps_disk": pytest.approx(1.0, rel=1e-3),
        "gate_load_gbps_remote": COLD.load_bytes_per_s / 1e9,
        "gate_prefill_tokens_per_s": pytest.approx(4000, rel=1e-3),
    }


@given(st.lists(st.sampled_from(["memory", "disk", "remote", "other"]), max_size=6))
def test_slowest_is_one_of_the_tiers(tiers: list[str]) -> None:
    got = slowest(tiers, ["memory", "disk", "remote"])
    assert (got == "") == (not tiers) and (not tiers or got in tiers)
    if "remote" in tiers:
        assert got == "remote"


def test_loads_are_counted_by_the_slowest_tier_serving_them(tmp_path) -> None:
    from kvgate.index.kv.chunks import DiskTier

    memory, disk = MemoryTier(1 << 26), DiskTier(tmp_path, 1 << 26)
    src = PagedKV(strided_views((0, 1, 2, 3, 4)), BLOCKS)
    both = ChunkStore([memory, disk], "ns", LayerCodec("raw"))
    save(both, src, [SaveSpec(1, [1], [0]), SaveSpec(2, [2], [1])])
    memory.delete(both.key(2))  # chunk 1 from RAM, chunk 2 from disk: the load waited for the disk
    holders: list[str] = []
    assert both.longest_prefix([1, 2], holders) == 2 and holders == ["memory", "disk"]
    counters = Counters()
    Loader(both, PagedKV(strided_views((0, 1, 2, 3, 4)), BLOCKS), counters).load(LoadSpec("r", [1, 2], [[4], [5]], 0))
    assert list(counters.by_tier) == ["disk"] and counters.by_tier["disk"][:2] == [
        sum(c.nbytes for c in both.get_many([1, 2])),
        2,
    ]
    both.close()


def test_settings_for_the_gate_and_staging() -> None:
    s = parse({"tiers": {"disk": {"path": "/tmp/kv"}}})
    assert (s.gate, s.background_load_ms, s.staging_mb) == (True, 10.0, 2048)
    s = parse({"tiers": {"disk": {"path": "/tmp/kv"}}, "gate": "off", "background_load_ms": 0, "staging_mb": 64})
    assert (s.gate, s.background_load_ms, s.staging_mb) == (False, 0.0, 64)
    for bad in ({"gate": True}, {"background_load_ms": -1}, {"staging_mb": 0}):
        with pytest.raises(SettingsError, match=next(iter(bad))):
            parse({"tiers": {"disk": {"path": "/tmp/kv"}}, **bad})


def test_loader_is_usable_from_two_threads(store: ChunkStore) -> None:
    src = PagedKV(strided_views((0, 1, 2, 3, 4)), BLOCKS)
    save(store, src, [SaveSpec(h, [h], [h]) for h in range(4)])
    dst = PagedKV(strided_views((0, 1, 2, 3, 4)), BLOCKS)
    loader = Loader(store, dst, Counters())
    threads = [threading.Thread(target=loader.load, args=(LoadSpec(str(h), [h], [[h + 4]], skip=0),)) for h in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loader.take_failed() == set()
