"""Routing policies as pure decisions over replica states."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.middleware.routing import RoutePlan, make_policy
from kvgate.middleware.routing.base import ReplicaState
from kvgate.middleware.routing.cache_aware import (
    CacheAware,
    admissible,
    duplicate_charge,
    expected_cost,
    stall_charge,
    ttft_estimate,
    wait_bound,
)


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
    assert policy.choose(rs, p).name in ("r0", "r1")  # 5000 > 1600 + 1 × 1600 (the copy)
    rs[2].pending_prefill_tokens = 3000
    assert policy.choose(rs, p).name == "r2"  # re-prefilling elsewhere costs 1600 + 1600
    assert make_policy("cache_aware", miss_weight=1.0).choose(rs, p).name in ("r0", "r1")  # purely greedy
    assert make_policy("cache_aware").choose(rs, p).name == "r2"  # default: stickier
    assert expected_cost(rs[2], p) == 3000 + 0  # queued + nothing left to prefill


def test_stall_charge_sends_a_start_where_fewer_decodes_would_wait_for_it():
    rs = replicas(2)
    rs[0].in_flight = 4  # four decodes running there
    rs[1].in_flight, rs[1].pending_prefill_tokens = 1, 400  # one, and a short prompt queued
    start = plan(tokens=1600)  # no replica holds any of it
    assert make_policy("cache_aware").choose(rs, start).name == "r0"  # its own first token is sooner there
    stalling = make_policy("cache_aware", stall_weight=1.0)
    assert stalling.choose(rs, start).name == "r1"  # 400 tokens later for it, 3 × 1600 less waiting for others
    assert stall_charge(4, 1600) == 6400 and stall_charge(0, 1600) == 0 and stall_charge(3, -5) == 0
    assert expected_cost(rs[0], start, stall_weight=1.0) == 4 * 8 + 1600 + 4 * 1600


def test_stall_charge_keeps_a_later_turn_at_home_and_inside_the_wait_bound():
    rs = replicas(2)
    rs[0].in_flight = 6  # the conversation's home is busy decoding
    turn = plan({"r0": 90}, tokens=1600)  # 1440 of 1600 tokens held there: own prefill 160
    turn.shared_prefix = False
    assert make_policy("cache_aware", stall_weight=1.0).choose(rs, turn).name == "r0"  # 6 × 160 < 1440 + copy
    start = plan(tokens=1600)
    rs[0].in_flight, rs[1].pending_prefill_tokens = 12, 10_000
    # others' decodes would buy this start 10,000 tokens of queueing, unbounded ...
    assert make_policy("cache_aware", stall_weight=1.0, queue_slack=float("inf")).choose(rs, start).name == "r1"
    # ... but never more than the wait bound allows
    assert make_policy("cache_aware", stall_weight=1.0, queue_slack=1.0).choose(rs, start).name == "r0"


def test_duplicate_charge_weighs_a_prefix_by_its_share_of_the_prompt():
    assert duplicate_charge(0, 1600, 1600) == 1600  # the whole prompt is held elsewhere
    assert duplicate_charge(0, 160, 1600) == 16  # a 10% prefix (a system prompt): 1/10 of its length
    assert (
        duplicate_charge(160, 160, 1600) == 0 and duplicate_charge(0, 0, 1600) == 0 and duplicate_charge(0, 0, 0) == 0
    )
    rs = replicas()
    # a system prompt on r1 only (10% of the prompt) does not justify waiting behind r1's queue ...
    rs[1].pending_prefill_tokens = 4000
    assert make_policy("cache_aware").choose(rs, plan({"r1": 10})).name in ("r0", "r2")
    # ... while the same queue in front of this conversation's whole history is worth it
    assert make_policy("cache_aware").choose(rs, plan({"r1": 99})).name == "r1"


def test_wait_bound_caps_the_queueing_a_prefix_match_buys():
    """Invariant: ttft(chosen) <= best ttft + max(queue_slack · mean queue, prompt_slack · prompt),
    however large the duplicate charge."""
    rs = replicas(4)
    p = plan({"r0": 100}, tokens=1600)  # r0 holds all of it: an enormous charge elsewhere
    rs[0].pending_prefill_tokens = 3000
    rs[1].pending_prefill_tokens = rs[2].pending_prefill_tokens = rs[3].pending_prefill_tokens = 200
    # best = 200 + 1600 = 1800 (r1..r3); mean queue = 3600 / 4 = 900; bound = 1800 + max(2250, 800) = 4050
    assert wait_bound(1800, 900, 1600) == 4050
    assert ttft_estimate(rs[0], p) == 3000 and make_policy("cache_aware").choose(rs, p).name == "r0"
    rs[0].pending_prefill_tokens = 8000  # mean queue 2150 → bound 1800 + 5375 = 7175 < 8000: r0 is out
    assert [r.name for r in admissible(rs, p)] == ["r1", "r2", "r3"]
    assert make_policy("cache_aware").choose(rs, p).name != "r0"
    assert wait_bound(0, 0, 0, float("inf"), float("inf")) == float("inf")  # not nan
    unbounded = CacheAware(queue_slack=float("inf"), prompt_slack=float("inf"))
    assert unbounded.choose(rs, p).name == "r0"  # without the bound the charge keeps it on r0
    # the fastest replica is always admissible, so the policy always has a choice
    for q in (0, 10**6):
        rs[0].pending_prefill_tokens = q
        assert admissible(rs, p, queue_slack=0, prompt_slack=0)


def test_a_conversations_own_history_is_bounded_by_session_slack():
    """A match no other request continued differently (plan.shared_prefix false) is this
    conversation's history: with session_slack ∞ (the default) the bound does not apply to it;
    with a finite one it applies with session_slack as the queue slack."""
    rs = replicas(4)
    rs[0].pending_prefill_tokens = 8000  # as above: beyond the bound of a shared prefix
    rs[1].pending_prefill_tokens = rs[2].pending_prefill_tokens = rs[3].pending_prefill_tokens = 200
    shared = RoutePlan(list(range(100)), 1600, 16, {"r0": 100}, shared_prefix=True)
    own = RoutePlan(list(range(100)), 1600, 16, {"r0": 100}, shared_prefix=False)
    assert make_policy("cache_aware").choose(rs, shared).name != "r0"
    assert make_policy("cache_aware").choose(rs, own).name == "r0"
    # mean queue 2150: ttft(r0) 8000 <= 1800 + 4 × 2150 with session_slack 4, not with 2.5
    assert make_policy("cache_aware", session_slack=4).choose(rs, own).name == "r0"
    assert make_policy("cache_aware", session_slack=2.5).choose(rs, own).name != "r0"
    # a cold prompt has no history to keep: bounded as before whatever its flag says
    rs[0].pending_prefill_tokens = 0
    assert make_policy("cache_aware").choose(rs, RoutePlan([], 1600, 16, {}, shared_prefix=False)).name
    with pytest.raises(ValueError, match="session_slack"):
        CacheAware(session_slack=-1)


def test_wait_bound_slacks_come_from_the_routing_config():
    import yaml
    from pydantic import ValidationError

    from kvgate.middleware.config import RoutingConfig

    cfg = RoutingConfig(**yaml.safe_load("{policy: {name: cache_aware, queue_slack: .inf, prompt_slack: 0.25}}"))
    policy = make_policy(cfg.policy)
    assert policy.queue_slack == float("inf") and policy.prompt_slack == 0.25 and policy.settings is cfg.policy
    default = make_policy(RoutingConfig(policy="cache_aware").policy)
    assert (default.queue_slack, default.prompt_slack, default.session_slack) == (2.5, 0.5, float("inf"))
    assert make_policy(RoutingConfig(policy={"name": "cache_aware", "session_slack": 3}).policy).session_slack == 3
    assert make_policy(RoutingConfig(policy={"name": "affinity", "load_factor": 2}).policy).load_factor == 2
    with pytest.raises(ValidationError, match="session_slack"):
        RoutingConfig(policy={"name": "cache_aware", "session_slack": -1})
    with pytest.raises(ValidationError, match="queue_slack"):
        RoutingConfig(policy={"name": "cache_aware", "queue_slack": -1})
    with pytest.raises(ValueError, match="queue_slack"):
        make_policy("cache_aware", queue_slack=-1)  # knobs by name are validated as the config is


@pytest.mark.parametrize("seed", range(20))
def test_cache_aware_choice_respects_the_bound(seed):
    import random

    rng = random.Random(seed)
    rs = replicas(4)
    for r in rs:
        r.pending_prefill_tokens, r.in_flight = rng.randrange(0, 50_000), rng.randrange(0, 20)
    p = plan({r.name: rng.randrange(0, 101) for r in rs}, tokens=1600)
    policy = make_policy("cache_aware")
    chosen = policy.choose(rs, p)
    ttft = [ttft_estimate(r, p) for r in rs]
    mean_queue = sum(r.pending_prefill_tokens + 8 * r.in_flight for r in rs) / 4
    assert ttft_estimate(chosen, p) <= min(ttft) + max(2.5 * mean_queue, 0.5 * 1600)


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


def test_new_sessions_resident_places_a_first_turn_where_fewest_tokens_live():
    rs, policy = replicas(2), make_policy("cache_aware", new_sessions="resident")
    rs[0].resident_tokens, rs[1].resident_tokens = 9000, 3000
    rs[1].pending_prefill_tokens = 500
    assert policy.choose(rs, plan()).name == "r1"
    assert make_policy("cache_aware").choose(rs, plan()).name == "r0"  # load: the emptier queue now
    rs = replicas(3)
    rs[0].resident_tokens, rs[1].resident_tokens, rs[2].resident_tokens = 9000, 3000, 9000
    rs[1].pending_prefill_tokens = 5000  # past the bound (2.5 × the mean queue): the queue decides
    assert policy.choose(rs, plan()).name in ("r0", "r2")
    assert ttft_estimate(rs[1], plan()) > wait_bound(1600, 5000 / 3, 1600)


def test_new_sessions_resident_leaves_a_later_turn_with_its_history():
    rs, policy = replicas(2), make_policy("cache_aware", new_sessions="resident")
    rs[0].resident_tokens, rs[1].resident_tokens = 9000, 0
    for blocks in (60, 10):  # 960 or 160 of 1600 tokens held there: a history, long or short
        history = plan({"r0": blocks})
        history.shared_prefix = False  # no other request continued those blocks differently
        assert policy.choose(rs, history).name == "r0"
    shared = plan({"r0": 10})  # other conversations continued those 10 blocks differently
    assert shared.shared_prefix and policy.choose(rs, shared).name == "r1"  # a start, placed by residents


def test_new_sessions_is_checked_by_the_config():
    with pytest.raises(ValueError, match="new_sessions"):
        make_policy("cache_aware", new_sessions="fewest")


def _composed_choice(policy: CacheAware, candidates, p):
    """cache_aware's rule as the composition of its pure functions: admissible, then the least
    expected cost (ties: fewer in flight, then the rotation's order)."""
    rotated = policy._ties.rotated(candidates)
    best_match = max(p.held_tokens(r.name) for r in rotated)
    starts = p.shared_prefix or best_match == 0
    slack = policy.queue_slack if starts else policy.session_slack
    allowed = admissible(rotated, p, policy.decode_weight, slack, policy.prompt_slack)

    def cost(r):
        return expected_cost(r, p, policy.decode_weight, policy.miss_weight, best_match, policy.stall_weight)

    if policy.reads_resident and starts:
        return min(allowed, key=lambda r: (r.resident_tokens, cost(r), r.in_flight))
    return min(allowed, key=lambda r: (cost(r), r.in_flight))


_replica_figures = st.tuples(st.integers(0, 6000), st.integers(0, 6), st.integers(0, 9000))


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_replica_figures, min_size=1, max_size=5),
    st.lists(st.tuples(st.integers(0, 120), st.integers(0, 120)), min_size=5, max_size=5),
    st.integers(0, 2000),
    st.sampled_from([16, 64]),
    st.sampled_from([0.0, 0.3, 1.0]),
    st.booleans(),
    st.sampled_from([(2.5, 0.5, float("inf")), (0.0, 0.0, 1.0), (float("inf"), 0.5, 2.0)]),
    st.sampled_from(["load", "resident"]),
    st.sampled_from([1.0, 64.0]),
    st.sampled_from([0.0, 0.5, 1.0]),
)
def test_cache_aware_chooses_what_its_pure_functions_compose_to(
    figures, blocks, tokens, block_size, load_cost, shared, slacks, new_sessions, miss_weight, stall_weight
):
    """choose() works each candidate's figures out once; its choice is the composition's, for any
    queues, matches, tier blocks, slacks and placement of new conversations."""
    made = []
    for _ in range(2):
        rs = replicas(len(figures))
        for r, (pending, in_flight, resident) in zip(rs, figures):
            r.pending_prefill_tokens, r.in_flight, r.resident_tokens = pending, in_flight, resident
        made.append(rs)
    matched = {f"r{i}": m for i, (m, _) in enumerate(blocks[: len(figures)]) if m}
    tiers = {f"r{i}": t for i, (_, t) in enumerate(blocks[: len(figures)]) if t}
    p = RoutePlan([], tokens, block_size, matched, None, shared_prefix=shared, tier_blocks=tiers, load_cost=load_cost)
    queue_slack, prompt_slack, session_slack = slacks
    knobs = dict(miss_weight=miss_weight, queue_slack=queue_slack, prompt_slack=prompt_slack)
    knobs.update(session_slack=session_slack, new_sessions=new_sessions, stall_weight=stall_weight)
    ours, composed = CacheAware(**knobs), CacheAware(**knobs)
    for _ in range(3):  # the rotation moves on each call, in both alike
        assert ours.choose(made[0], p).name == _composed_choice(composed, made[1], p).name
