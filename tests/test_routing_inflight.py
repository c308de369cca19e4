"""Precise mode counts a routed prefix as its replica's until the engine reports what it holds:
requests sharing a prefix that arrive together stay together instead of each replica prefilling it."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import TextTokenizer
from kvgate.index.kv.tokenizer_light import LEAD_MARGIN_CHARS
from kvgate.middleware.config import PrefixConfig, ReplicaConfig, RoutingConfig
from kvgate.middleware.routing import inflight as inflight_module
from kvgate.middleware.routing.inflight import GRACE_S, ROUTED, InFlightPrefixes
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
    entries = [inflight.sent(replica, chain) for replica, chain in chains]
    for i, entry in enumerate(entries):
        inflight.done(entry)
        clock.now += GRACE_S + 0.01
        still = {(r, h) for r, c in chains[i + 1 :] for h in c}
        inflight.expire()
        for r, c in chains:
            folded = inflight.fold(index.match(c))
            assert set(folded) == {"a", "b"}  # no routed@ key leaks out
            expected = next((k for k, h in enumerate(c) if (r, h) not in still), len(c))
            assert folded[r] == expected


# ------------------------------------------------------------------ a prompt routed on its first blocks
class Leading(TextTokenizer):
    """Code points as tokens, with a model tokenizer's lead (prompt.py hashes a long new message
    from one); `gate` holds the whole encodes of long messages (the completer's)."""

    backend = "fake"
    name = "leading"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()

    def packed(self, segment: str) -> bytes:
        if len(segment) > 1000:
            self.gate.wait(10)
        return super().packed(segment)

    def packed_lead(self, segment: str, chars: int) -> bytes | None:
        return (
            super().packed(segment[: chars - LEAD_MARGIN_CHARS]) if len(segment) > chars + LEAD_MARGIN_CHARS else None
        )


def leading_router(clock: Clock, tok: Leading) -> Router:
    replicas = [ReplicaConfig(name=n, api_base=f"http://127.0.0.1:9/{n}/v1") for n in "ab"]
    cfg = RoutingConfig(
        policy="cache_aware", prefix=PrefixConfig(mode="precise", block_size=16, tokenizer="codepoints")
    )
    router = Router(replicas, cfg, clock=clock, defer_records=True)
    router.planner.hasher = PromptHasher(tok, 16)  # the configured code points, with a lead
    return router


def test_a_long_new_prompt_routed_on_its_lead_is_in_flight_whole_once_completed() -> None:
    """Precise mode behind the proxy: a new long document is routed on its first blocks, and its
    whole chain counts as on its way to that replica once the in-flight view completed it, so a
    second request reading the same document finds all of it there."""
    clock, tok = Clock(), Leading()
    router = leading_router(clock, tok)
    doc = " ".join(f"line {i} of a long document nobody sent before." for i in range(400))
    try:
        first = [{"role": "user", "content": doc + " Question one?"}]
        whole = PromptHasher(TextTokenizer(), 16).prompt(first).hashes
        tok.gate.clear()  # the completion waits: the first request is sent on its lead's blocks
        router.prepare(first)
        plan = router.plan(first)
        assert plan.prompt is not None and plan.prompt.untokenized and len(plan.hashes) < len(whole) // 4
        assert plan.prompt_tokens == pytest.approx(len("".join(TextTokenizer().segments(first))), rel=0.1)
        replica = router.choose(plan)
        ticket = router.started(replica, plan)
        tok.gate.set()
        assert router.inflight is not None
        deadline = time.monotonic() + 10
        while len(ticket.routed.hashes) < len(whole) - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        second = [{"role": "user", "content": doc + " Question two, longer?"}]
        router.prepare(second)
        plan2 = router.plan(second)
        shared = next(
            k for k, (x, y) in enumerate(zip(whole, PromptHasher(TextTokenizer(), 16).prompt(second).hashes)) if x != y
        )
        assert plan2.matched_blocks[replica.name] == shared  # the whole document, not only the lead
        assert router.choose(plan2).name == replica.name
        router.finished(ticket, True)
        clock.now += GRACE_S + 0.01
        router.inflight.expire()
        assert router.index.match(whole).get(ROUTED + replica.name, 0) == 0  # all of it dropped
    finally:
        tok.gate.set()
        router.close()


def test_a_completion_after_the_request_was_dropped_adds_nothing() -> None:
    clock = Clock()
    index = PrefixIndex()
    index.add_replica("a")
    inflight = InFlightPrefixes(index, clock, deferred=True)
    tok = Leading()
    hasher = PromptHasher(tok, 16)
    msgs = [{"role": "user", "content": "word " * 2000}]
    try:
        tok.gate.clear()
        prompt = hasher.prompt(msgs, until=lambda h: False)
        entry = inflight.sent("a", prompt.hashes, prompt)
        inflight.done(entry)
        clock.now += GRACE_S + 0.01
        inflight.expire()  # dropped before the completion ran
        tok.gate.set()
        inflight.close()  # waits for the completion
        assert not prompt.partial and index.blocks(ROUTED + "a") == 0
    finally:
        tok.gate.set()
        inflight.close()


def test_an_estimate_near_the_context_is_counted_before_the_check() -> None:
    """A prompt matched on a lead has an estimated token count; the context check before it is
    sent (precise mode) needs the real one once the estimate is within reach of the limit."""
    clock, tok = Clock(), Leading()
    router = leading_router(clock, tok)
    msgs = [{"role": "user", "content": "a fresh long question, " * 800}]
    exact = PromptHasher(TextTokenizer(), 16).prompt(msgs).tokens
    try:
        router.planner.prepare(msgs, None, context=exact * 4)  # far from the limit: left estimated
        far = router.plan(msgs)
        assert far.prompt is not None and far.prompt.untokenized
        router.planner.prepare(msgs, None, context=exact + 100)  # within reach: counted here
        near = router.plan(msgs)
        assert near.prompt is not None and not near.prompt.untokenized and near.prompt_tokens == exact
    finally:
        router.close()


def test_past_its_bound_a_request_keeps_the_blocks_it_was_routed_on(monkeypatch) -> None:
    monkeypatch.setattr(inflight_module, "MAX_PENDING_COMPLETIONS", 1)
    index = PrefixIndex()
    index.add_replica("a")
    inflight = InFlightPrefixes(index, Clock(), deferred=True)
    tok = Leading()
    hasher = PromptHasher(tok, 16)
    try:
        tok.gate.clear()
        first = hasher.prompt([{"role": "user", "content": "word " * 2000}], until=lambda h: False)
        second = hasher.prompt([{"role": "user", "content": "other " * 2000}], until=lambda h: False)
        one, two = inflight.sent("a", first.hashes, first), inflight.sent("a", second.hashes, second)
        assert one is not None and two is not None
        tok.gate.set()
        inflight.close()  # waits for the one completion queued
        assert not first.partial and len(one.hashes) == len(first.hashes)
        assert second.partial and len(two.hashes) == len(second.hashes)  # not queued: as routed
    finally:
        tok.gate.set()
        inflight.close()
