"""Tier-aware routing: KV-tier media from the engines' events become tier replicas in the prefix
index (middleware/routing/tiers.py), plans count what each replica can load, cache_aware weighs
loads at the measured cost (middleware/routing/load_cost.py)."""

from __future__ import annotations

import random

from kvgate.index.kv.hashing import block_hashes
from kvgate.index.kv.kv_events import BlockRemoved, BlockStored, EventApplier
from kvgate.index.kv.prefix import PrefixIndex
from kvgate.middleware.routing.base import ReplicaState, RoutePlan
from kvgate.middleware.routing.cache_aware import CacheAware, ttft_estimate
from kvgate.middleware.routing.load_cost import MIN_SAMPLES, LoadCost, fit_lambda
from kvgate.middleware.routing.tiers import TierMedia

BS = 4


def toks(n_blocks: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_blocks * BS))


def feed(index: PrefixIndex, tiers: TierMedia, replica: str) -> EventApplier:
    if replica not in index.replicas:
        index.add_replica(replica)
    return EventApplier(index, replica, BS, tiers=tiers)


def test_a_shared_tier_is_loadable_by_every_replica_that_reads_it() -> None:
    index = PrefixIndex()
    tiers = TierMedia(index, None)
    a, b = feed(index, tiers, "a"), feed(index, tiers, "b")
    a.apply(BlockStored([1, 2, 3], None, toks(3), BS, None, "GPU"))
    a.apply(BlockStored([1, 2, 3], None, [], BS, None, "disk:abc"))
    a.apply(BlockStored([1, 2, 3], None, [], BS, None, "memory"))
    b.apply(BlockStored([9], None, toks(1, 500), BS, None, "GPU"))
    b.apply(BlockStored([9], None, [], BS, None, "disk:abc"))  # b reads the same directory
    ours = block_hashes(toks(3), BS)
    engines, loadable = tiers.split(index.match(ours))
    assert {k: v for k, v in engines.items() if v} == {"a": 3}  # tier replicas never appear as engines
    assert loadable == {"a": 3, "b": 3}
    # the engine evicts: a's engine match goes, the tier still has them
    a.apply(BlockRemoved([1, 2, 3], "GPU"))
    engines, loadable = tiers.split(index.match(ours))
    assert engines.get("a", 0) == 0 and loadable == {"a": 3, "b": 3}
    # the disk tier evicts the last block: both can load two
    a.apply(BlockStored([1, 2, 3], None, toks(3), BS, None, "GPU"))
    a.apply(BlockRemoved([3], "disk:abc"))
    _, loadable = tiers.split(index.match(ours))
    assert loadable == {"a": 3, "b": 2}  # a still has all three in its private RAM tier


def test_a_private_tier_goes_with_its_replica_on_restart() -> None:
    index = PrefixIndex()
    tiers = TierMedia(index, None)
    a = feed(index, tiers, "a")
    a.apply(BlockStored([1], None, toks(1), BS, None, "GPU"))
    a.apply(BlockStored([1], None, [], BS, None, "memory"))
    a.apply(BlockStored([1], None, [], BS, None, "disk:x"))
    a.reset()  # restarted: its RAM is gone, the directory stays
    assert index.blocks("tier:memory@a") == 0 and index.blocks("tier:disk:x") == 1
    assert tiers.readable("a") == set()  # relearned from its next events


def test_other_media_stay_with_the_replica() -> None:
    index = PrefixIndex()
    tiers = TierMedia(index, None)
    a = feed(index, tiers, "a")
    a.apply(BlockStored([1], None, toks(1), BS, None, "GPU"))
    a.apply(BlockStored([1], None, [], BS, None, "CPU"))  # vLLM's own offloading: the engine's
    a.apply(BlockRemoved([1], "GPU"))
    assert index.match(block_hashes(toks(1), BS)) == {"a": 1}
    assert not any(TierMedia.is_tier(r) for r in index.replicas)


def plan(engine: dict[str, int], tier: dict[str, int], load_cost: float, blocks: int = 16) -> RoutePlan:
    return RoutePlan(list(range(blocks)), blocks * 128, 128, engine, tier_blocks=tier, load_cost=load_cost)


def test_loadable_tokens_never_cover_the_last_block() -> None:
    p = plan({"a": 2}, {"a": 16, "b": 16}, 0.1)
    assert p.loadable_tokens("a") == 15 * 128 - 2 * 128 and p.loadable_tokens("b") == 15 * 128
    assert p.held_tokens("b") == 15 * 128


def test_cache_aware_moves_a_session_when_a_shared_tier_makes_it_cheap() -> None:
    busy = ReplicaState("a", "", in_flight=3, pending_prefill_tokens=4000)
    idle = ReplicaState("b", "")
    policy = CacheAware()
    # history only in a's engine: moving it re-prefills everything, so it stays on a
    assert policy.choose([busy, idle], plan({"a": 15}, {}, 1.0)).name == "a"
    # the same history in a shared tier b reads, loads measured cheap: the idle replica takes it
    assert policy.choose([busy, idle], plan({"a": 15}, {"a": 15, "b": 15}, 0.05)).name == "b"
    # loads measured as dear as prefill and a shorter queue on a: the engine match wins
    less_busy = ReplicaState("a", "", in_flight=3, pending_prefill_tokens=1000)
    assert policy.choose([less_busy, idle], plan({"a": 15}, {"a": 15, "b": 15}, 1.0)).name == "a"
    assert policy.choose([less_busy, idle], plan({"a": 15}, {"a": 15, "b": 15}, 0.05)).name == "b"
    assert abs(ttft_estimate(idle, plan({}, {"b": 15}, 0.1)) - (128 + 0.1 * 15 * 128)) < 1e-6


def test_load_cost_is_measured_from_samples() -> None:
    rng = random.Random(0)
    cost = LoadCost()
    assert cost.value == 1.0  # no tier helps until measured
    for i in range(MIN_SAMPLES * 4):
        prefill = rng.randint(64, 2000)
        loaded = rng.randint(128, 1800) if i % 2 else 0
        cost.observe(prefill, loaded, 0.05 + 0.002 * prefill + 0.0002 * loaded + rng.gauss(0, 0.001))
    assert abs(cost.value - 0.1) < 0.03
    assert fit_lambda([(1, 0, 1.0), (1, 0, 1.0), (1, 0, 1.0)]) is None  # nothing separates the slopes
    assert fit_lambda([(100, 0, 1.0), (200, 0, 2.0), (100, 100, 9.0), (50, 300, 30.0)]) == 1.0  # clamped
