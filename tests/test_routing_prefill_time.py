"""prefill_time (middleware/routing/prefill_time.py) and the engine reports it reads
(middleware/routing/engine_load.py): pure scoring, its invariants on random states, online
calibration of the prefill rate, and the Router filling both in before a decision."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.middleware.config import ReplicaConfig, RoutingConfig
from kvgate.middleware.routing import RoutePlan, make_policy
from kvgate.middleware.routing.base import ReplicaState
from kvgate.middleware.routing.engine_load import EngineLoad, EngineReport, fit_rate, waiting_tokens
from kvgate.middleware.routing.prefill_time import (
    PrefillTime,
    effective_rates,
    prefill_tokens,
    queued_tokens,
    ttft_seconds,
)
from kvgate.middleware.routing.router import Router

BLOCK = 16


def state(
    name: str, pending: int = 0, engine_waiting: float = 0.0, rate: float | None = None, in_flight: int = 0
) -> ReplicaState:
    r = ReplicaState(name, f"http://{name}")
    r.pending_prefill_tokens, r.engine_waiting_tokens, r.prefill_rate, r.in_flight = (
        pending,
        engine_waiting,
        rate,
        in_flight,
    )
    return r


def plan(matched: dict[str, int], tokens: int = 1600) -> RoutePlan:
    return RoutePlan(list(range(tokens // BLOCK)), tokens, BLOCK, matched)


# -------------------------------------------------------------------------------- pure scoring


def test_a_request_waits_behind_a_long_prefill_only_for_a_longer_recompute() -> None:
    """The arena's case: a replica busy with a 1926-token prefill holds 256 tokens of this prompt;
    the other, nearly idle, holds none. Recomputing 256 tokens beats waiting for 1926."""
    busy, idle = state("busy", pending=1926), state("idle", pending=262)
    p = plan({"busy": 256 // BLOCK}, tokens=1800)
    assert make_policy("prefill_time").choose([busy, idle], p).name == "idle"
    assert make_policy("cache_aware").choose([busy, idle], p).name == "busy"  # the duplicate charge keeps it


def test_a_session_moves_only_when_the_queue_outweighs_its_recompute() -> None:
    policy = PrefillTime()
    holder, other = state("holder"), state("other")
    p = plan({"holder": 100}, tokens=1700)  # the holder has 1600 of 1700 tokens
    for queued, expected in ((0, "holder"), (1599, "holder"), (1601, "other")):
        holder.pending_prefill_tokens = queued
        assert policy.choose([holder, other], p).name == expected, queued


def test_the_engines_waiting_work_counts_when_larger_than_the_routers_own() -> None:
    a, b = state("a", pending=100, engine_waiting=3000.0), state("b", pending=500)
    assert queued_tokens(a) == 3000 and queued_tokens(b) == 500
    assert PrefillTime().choose([a, b], plan({})).name == "b"
    a.engine_waiting_tokens = 50.0  # the router's own count is never lowered by a stale engine view
    assert queued_tokens(a) == 100


def test_a_faster_engine_wins_at_equal_work() -> None:
    slow, fast = state("slow", pending=800, rate=400.0), state("fast", pending=800, rate=1600.0)
    assert PrefillTime().choose([slow, fast], plan({})).name == "fast"
    assert ttft_seconds(slow, plan({}), 400.0) == pytest.approx((800 + 1600) / 400)


def test_rates_not_measured_yet_take_the_measured_mean_or_the_cold_default() -> None:
    assert effective_rates([state("a"), state("b")], 1000.0) == [1000.0, 1000.0]
    assert effective_rates([state("a", rate=300.0), state("b"), state("c", rate=500.0)], 1000.0) == [
        300.0,
        400.0,
        500.0,
    ]
    with pytest.raises(ValueError):
        make_policy("prefill_time", cold_prefill_rate=0)


def test_loads_from_a_tier_count_at_their_measured_cost() -> None:
    p = RoutePlan(list(range(100)), 1600, BLOCK, {"a": 10}, tier_blocks={"a": 60}, load_cost=0.25)
    r = state("a")
    # 160 held by the engine, 800 more loadable (60 blocks), 640 to prefill; loads at 1/4 of a prefill
    assert prefill_tokens(r, p) == pytest.approx(640 + 0.25 * 800)


def test_ties_go_to_fewer_in_flight_then_round_robin() -> None:
    policy = PrefillTime()
    a, b = state("a", in_flight=2), state("b", in_flight=1)
    assert policy.choose([a, b], plan({})).name == "b"
    b.in_flight = 2
    assert {policy.choose([a, b], plan({})).name for _ in range(4)} == {"a", "b"}


# ------------------------------------------------------------------------ invariants on random states

replica_st = st.tuples(
    st.integers(0, 200),
    st.integers(0, 20_000),
    st.floats(0, 20_000),
    st.one_of(st.none(), st.floats(50, 5000)),
    st.integers(0, 8),
)


def _states(specs: list[tuple[int, int, float, float | None, int]]) -> tuple[list[ReplicaState], RoutePlan]:
    reps = [
        state(f"r{i}", pending=p, engine_waiting=w, rate=rate, in_flight=n)
        for i, (_, p, w, rate, n) in enumerate(specs)
    ]
    return reps, plan({f"r{i}": blocks for i, (blocks, *_) in enumerate(specs)}, tokens=3200)


@settings(max_examples=300, deadline=None)
@given(st.lists(replica_st, min_size=2, max_size=5))
def test_never_a_replica_dominated_in_work_by_one_at_least_as_fast(specs) -> None:
    reps, p = _states(specs)
    chosen = PrefillTime().choose(reps, p)
    rates = dict(zip((r.name for r in reps), effective_rates(reps)))
    for other in reps:
        dominated = (
            prefill_tokens(chosen, p) > prefill_tokens(other, p)
            and queued_tokens(chosen) > queued_tokens(other)
            and rates[chosen.name] <= rates[other.name]
        )
        assert not dominated, (chosen, other)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 200), min_size=2, max_size=5),
    st.integers(0, 20_000),
    st.one_of(st.none(), st.floats(50, 5000)),
)
def test_equal_queues_and_rates_reduce_to_longest_prefix(blocks, queued, rate) -> None:
    reps = [state(f"r{i}", pending=queued, rate=rate) for i in range(len(blocks))]
    p = plan({f"r{i}": b for i, b in enumerate(blocks)}, tokens=3200)
    chosen = PrefillTime().choose(reps, p)
    assert p.matched_tokens(chosen.name) == max(p.matched_tokens(r.name) for r in reps)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 200), st.integers(0, 200), st.integers(0, 20_000), st.integers(0, 20_000))
def test_a_held_prefix_is_left_only_for_a_queue_larger_than_its_recompute(held, other_held, q_holder, q_other) -> None:
    held, other_held = max(held, other_held), min(held, other_held)
    holder, other = state("holder", pending=q_holder), state("other", pending=q_other)
    p = plan({"holder": held, "other": other_held}, tokens=3200)
    recompute = p.matched_tokens("holder") - p.matched_tokens("other")
    chosen = PrefillTime().choose([holder, other], p)
    if chosen.name == "other" and recompute > 0:
        assert q_holder - q_other >= recompute


# ------------------------------------------------------------------------ calibration from the engine


def test_fit_rate_is_the_ratio_of_sums_once_enough_prefill_was_seen() -> None:
    assert fit_rate([]) is None and fit_rate([(100.0, 0.01)]) is None  # too little prefill time to trust
    assert fit_rate([(400.0, 1.0), (1200.0, 3.0)]) == pytest.approx(400.0)
    assert fit_rate([(0.0, 1.0)]) is None


def test_waiting_tokens_age_toward_zero_at_the_measured_rate() -> None:
    assert waiting_tokens(3, 500.0, 1000.0, 0.0) == 1500.0
    assert waiting_tokens(3, 500.0, 1000.0, 1.0) == 500.0
    assert waiting_tokens(3, 500.0, 1000.0, 5.0) == 0.0
    assert waiting_tokens(3, None, 1000.0, 0.0) == 0.0 and waiting_tokens(0, 500.0, 1000.0, 0.0) == 0.0


def test_engine_load_calibrates_from_counter_growth_and_survives_a_restart() -> None:
    now = [0.0]
    load = EngineLoad(lambda: now[0])
    load.report("a", EngineReport(running=0, waiting=0, prefill_tokens=1000, prefill_seconds=10, prefill_requests=4))
    assert load.view("a") == (None, 0.0)  # one reading: nothing grew yet
    load.report("a", EngineReport(running=1, waiting=2, prefill_tokens=1800, prefill_seconds=12, prefill_requests=6))
    rate, waiting = load.view("a")
    assert rate == pytest.approx(400.0) and waiting == pytest.approx(2 * 400.0)  # 800 tokens over 2 requests
    now[0] = 1.0
    assert load.view("a")[1] == pytest.approx(400.0)  # drained at 400 tokens/s
    # the engine restarted: its counters start again from zero, and count as growth from zero
    load.report("a", EngineReport(running=0, waiting=0, prefill_tokens=600, prefill_seconds=1, prefill_requests=1))
    assert load.view("a")[0] == pytest.approx((800 + 600) / 3)
    assert load.stats("a")["intervals"] == 2
    load.forget("a")
    assert load.view("a") == (None, 0.0) and load.stats("a") is None


def test_the_router_fills_engine_reports_into_its_decisions() -> None:
    now = [0.0]
    cfg = RoutingConfig(policy="prefill_time", prefix={"tokenizer": "text", "block_size": 16})
    router = Router(
        [ReplicaConfig(name="a", api_base="http://a"), ReplicaConfig(name="b", api_base="http://b")],
        cfg,
        clock=lambda: now[0],
    )
    try:
        assert router.reads_engine_load
        for name, tokens in (("a", 0), ("b", 0)):
            router.engine_report(
                name, EngineReport(waiting=0, prefill_tokens=tokens, prefill_seconds=0, prefill_requests=0)
            )
        router.engine_report("a", EngineReport(waiting=4, prefill_tokens=2000, prefill_seconds=2, prefill_requests=2))
        router.engine_report("b", EngineReport(waiting=0, prefill_tokens=2000, prefill_seconds=2, prefill_requests=2))
        router.engine_report("gone", EngineReport(waiting=9))  # not on this route: ignored
        p = router.plan([{"role": "user", "content": "hello " * 50}])
        chosen = router.choose(p)
        assert chosen is not None and chosen.name == "b"  # a's engine has 4 × 1000 tokens waiting
        a = next(r for r in router.replicas if r.name == "a")
        assert a.prefill_rate == pytest.approx(1000.0) and a.engine_waiting_tokens == pytest.approx(4000.0)
        assert router.stats()["a"]["engine_load"]["waiting"] == 4
        router.remove_replica("a")
        assert router.engine_load.view("a") == (None, 0.0)
    finally:
        router.close()
    other = Router([ReplicaConfig(name="c", api_base="http://c")], RoutingConfig())
    assert not other.reads_engine_load  # cache_aware: the proxy reads no engine for it
    other.close()
