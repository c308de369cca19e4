"""Routing policies as pure decisions over replica states."""
from __future__ import annotations

from collections import Counter

import pytest

from middleware.routing import RoutePlan, make_policy
from middleware.routing.base import ReplicaState
from middleware.routing.cache_aware import expected_cost


def replicas(n=3):
    return [ReplicaState(f"r{i}", f"http://r{i}") for i in range(n)]


def plan(matched=None, tokens=1600, session=None):
    return RoutePlan(list(range(tokens // 16)), tokens, 16, matched or {}, session)


def test_round_robin_cycles():
    rs, policy = replicas(), make_policy("round_robin")
    assert [policy.choose(rs, plan()).name for _ in range(6)] == ["r0", "r1", "r2"] * 2


def test_least_loaded():
    rs = replicas()
    rs[0].in_flight, rs[1].in_flight, rs[2].in_flight = 3, 1, 2
    assert make_policy("least_loaded").choose(rs, plan()).name == "r1"


def test_cache_aware_prefers_longest_prefix_when_idle():
    rs = replicas()
    assert make_policy("cache_aware").choose(rs, plan({"r2": 90, "r1": 10})).name == "r2"


def test_cache_aware_spills_when_queue_outweighs_savings():
    rs = replicas()
    p = plan({"r2": 100}, tokens=1600)  # r2 holds the whole prompt: saves 1600 tokens
    rs[2].pending_prefill_tokens = 5000  # but 5000 tokens of prefill are queued ahead there
    policy = make_policy("cache_aware", miss_weight=2.0)
    assert policy.choose(rs, p).name in ("r0", "r1")  # 5000 > 2 × 1600
    rs[2].pending_prefill_tokens = 3000
    assert policy.choose(rs, p).name == "r2"  # re-prefilling elsewhere costs 2 × 1600
    assert make_policy("cache_aware", miss_weight=1.0).choose(rs, p).name in ("r0", "r1")  # purely greedy
    assert make_policy("cache_aware").choose(rs, p).name == "r2"  # default 8: stickier
    assert expected_cost(rs[2], p) == 3000 + 0  # queued + nothing left to prefill


def test_cache_aware_spreads_cold_requests():
    rs, policy = replicas(), make_policy("cache_aware")
    chosen = []
    for _ in range(6):
        r = policy.choose(rs, plan())
        r.in_flight += 1
        r.pending_prefill_tokens += 1600
        chosen.append(r.name)
    assert Counter(chosen) == {"r0": 2, "r1": 2, "r2": 2}


def test_affinity_is_sticky_and_bounded():
    rs, policy = replicas(4), make_policy("affinity", load_factor=1.25)
    first = policy.choose(rs, plan(session="alice")).name
    assert all(policy.choose(rs, plan(session="alice")).name == first for _ in range(5))
    homes = {policy.choose(rs, plan(session=f"user{i}")).name for i in range(40)}
    assert len(homes) == 4  # sessions spread over the ring
    by = {r.name: r for r in rs}
    by[first].in_flight = 10  # overloaded: alice goes elsewhere for now
    assert policy.choose(rs, plan(session="alice")).name != first


def test_affinity_moves_few_sessions_when_a_replica_leaves():
    rs, policy = replicas(4), make_policy("affinity")
    before = {s: policy.choose(rs, plan(session=s)).name for s in (f"u{i}" for i in range(200))}
    after = {s: policy.choose(rs[:3], plan(session=s)).name for s in before}
    moved = [s for s in before if before[s] != after[s]]
    assert all(before[s] == "r3" for s in moved)  # only r3's sessions moved


def test_unknown_policy():
    with pytest.raises(ValueError, match="cache_aware"):
        make_policy("random")
