"""Precise mode counts a routed prefix as its replica's until the engine reports what it holds:
requests sharing a prefix that arrive together stay together instead of each replica prefilling it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.index.kv.prefix import PrefixIndex
from kvgate.middleware.config import PrefixConfig, ReplicaConfig, RoutingConfig
from kvgate.middleware.routing.inflight import GRACE_S, InFlightPrefixes
from kvgate.middleware.routing.router import Router

BS = 4
PREFIX = "A shared system prompt that many requests start with. " * 3


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def precise_router(clock: Clock) -> Router:
    replicas = [
        ReplicaConfig(name=n, api_base=f"http://127.0.0.1:9/{n}/v1", events=f"tcp://127.0.0.1:{p}")
        for n, p in (("a", 9), ("b", 10))
    ]
    cfg = RoutingConfig(
        policy="cache_aware", prefix=PrefixConfig(mode="precise", block_size=BS, tokenizer="codepoints")
    )
    return Router(replicas, cfg, clock=clock)


def test_concurrent_requests_with_one_prefix_go_to_one_replica() -> None:
    clock = Clock()
    router = precise_router(clock)
    try:
        first = router.plan([{"role": "user", "content": PREFIX + "question one?"}])
        a = router.choose(first)
        ticket = router.started(a, first)  # in flight: the engine has reported nothing yet
        second = router.plan([{"role": "user", "content": PREFIX + "question two?"}])
        assert second.matched_blocks[a.name] >= len(PREFIX) // BS  # the prefix is on its way to a
        assert router.choose(second).name == a.name  # not balanced onto the other replica
        router.finished(ticket, True)
        clock.now += GRACE_S / 2
        assert router.plan([{"role": "user", "content": PREFIX + "x"}]).matched_blocks[a.name] > 0
        clock.now += GRACE_S
        later = router.plan([{"role": "user", "content": PREFIX + "x"}])
        assert later.matched_blocks.get(a.name, 0) == 0  # only the engine's own events count now
    finally:
        router.close()


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("ab"), st.lists(st.integers(0, 6), min_size=1, max_size=5)), min_size=1, max_size=12
    )
)
def test_a_block_stays_while_any_request_holds_it(requests) -> None:
    clock = Clock()
    index = PrefixIndex()
    for name in "ab":
        index.add_replica(name)
    inflight = InFlightPrefixes(index, clock)
    chains = [(replica, [h + 1 for h in hashes]) for replica, hashes in requests]
    for replica, chain in chains:
        inflight.sent(replica, chain)
    for i, (replica, chain) in enumerate(chains):
        inflight.done(replica, chain)
        clock.now += GRACE_S + 0.01
        still = {(r, h) for r, c in chains[i + 1 :] for h in c}
        inflight.expire()
        for r, c in chains:
            folded = inflight.fold(index.match(c))
            assert set(folded) == {"a", "b"}  # no routed@ key leaks out
            expected = next((k for k, h in enumerate(c) if (r, h) not in still), len(c))
            assert folded[r] == expected
