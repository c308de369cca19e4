"""The simulated replica: SimEngine's prefix cache and timing model on virtual time, then the
HTTP face driven by the openai client and real LiteLLM, and its KV events into a PrefixIndex."""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import os
import threading
import time
from os.path import commonprefix
from typing import Any, Awaitable, Iterator

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx
import litellm
import pytest
from openai import OpenAI

from kvgate.engines.api import publisher_callbacks
from kvgate.engines.sim import server as sim
from kvgate.engines.sim.engine import PrefixCache, SimEngine, render_transcript
from kvgate.engines.sim.server import answer_words, create_sim_app
from kvgate.index.kv.hashing import block_hashes, text_tokens
from kvgate.index.kv.kv_events import EventApplier, ZmqEventPublisher, ZmqEventSubscriber
from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import TextTokenizer
from kvgate.tools.bench.procs import ServerThread

SYSTEM = {"role": "system", "content": "You are a meticulous assistant. " * 8}


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


class VirtualClock:
    """Discrete-event time for asyncio: sleep() parks on a timer heap; run() lets every runnable
    task settle, then jumps to the earliest timer. No real waiting."""

    def __init__(self) -> None:
        self.now = 0.0
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = 0

    def time(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self.now + max(0.0, delay), self._seq, fut))
        self._seq += 1
        await fut

    async def at(self, t: float, coro: Awaitable[Any]) -> Any:
        """Start `coro` at virtual time t."""
        await self.sleep(t - self.now)
        return await coro

    def run(self, *coros: Awaitable[Any]) -> list[Any]:
        async def drive() -> list[Any]:
            tasks = [asyncio.ensure_future(c) for c in coros]
            self.tasks = tasks
            while True:
                for _ in range(50):
                    await asyncio.sleep(0)
                if all(t.done() for t in tasks):
                    return [None if t.cancelled() else t.result() for t in tasks]
                while self._timers and self._timers[0][2].done():
                    heapq.heappop(self._timers)
                if not self._timers:
                    raise RuntimeError("deadlock: tasks pending, no timers")
                when, _, fut = heapq.heappop(self._timers)
                self.now = max(self.now, when)
                fut.set_result(None)

        return asyncio.run(drive())


def make_engine(clock: VirtualClock | None = None, **kw: Any) -> SimEngine:
    opts: dict[str, Any] = {"capacity_tokens": 100_000, "block_size": 16, "prefill_tps": 1000.0, "decode_tps": 100.0}
    opts.update(kw)
    if clock is not None:
        opts.update(clock=clock.time, sleep=clock.sleep)
    return SimEngine(opts.pop("capacity_tokens"), opts.pop("block_size"), **opts)


def complete(engine: SimEngine, clock: VirtualClock, messages: list[dict[str, Any]], max_tokens: int | None = None):
    return clock.run(engine.complete(engine.request(messages, max_tokens)))[0]


# -- rendering and hashing ----------------------------------------------------------------------


def test_transcript_tokens_and_hashes_are_the_routers():
    engine = make_engine()
    msgs = [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]
    text = render_transcript(msgs)
    assert text == f"<|system|>\n{SYSTEM['content']}\n<|user|>\nHi\nthere\n<|assistant|>\n"
    req = engine.request(msgs)
    assert req.tokens == text_tokens(text) and req.prompt_tokens == len(text)
    assert req.hashes == block_hashes(text_tokens(text), 16)
    assert req.hashes == PromptHasher(TextTokenizer(), 16).hashes(msgs)[0]
    assert req.completion_tokens == 16 and engine.request(msgs, 3).completion_tokens == 3


# -- prefix cache ---------------------------------------------------------------------------------


def test_prefix_cache_lru_order_and_eviction():
    cache = PrefixCache(4)
    assert cache.insert(["a", "b", "c"]) == ([0, 1, 2], [])
    assert cache.hashes() == ["c", "b", "a"]  # touched last to first: the head is most recent
    assert cache.insert(["d", "e"]) == ([0, 1], ["c"])  # the old chain loses its tail first
    assert cache.match(["a", "b", "c"]) == 2 and cache.match(["x", "a"]) == 0
    assert cache.insert(["a"]) == ([], [])  # touch only
    assert cache.insert(["f", "g"]) == ([0, 1], ["b", "e"])
    assert sorted(cache.hashes()) == ["a", "d", "f", "g"] and len(cache) == 4
    assert PrefixCache(2).insert(["x", "y", "z"]) == ([0, 1], [])  # longer than capacity: its head
    empty = PrefixCache(0)
    assert empty.insert(["x"]) == ([], []) and len(empty) == 0


def test_repeat_hits_full_blocks_and_recomputes_last_token():
    clock = VirtualClock()
    engine = make_engine(clock)
    msgs = user("x" * 205)  # 229 tokens: 14 full blocks
    first = complete(engine, clock, msgs)
    assert (first.prompt_tokens, first.cached_tokens) == (229, 0)
    assert complete(engine, clock, msgs).cached_tokens == 14 * 16
    exact = user("y" * 200)  # 224 tokens = exactly 14 blocks: the last token is recomputed
    complete(engine, clock, exact)
    assert complete(engine, clock, exact).cached_tokens == 13 * 16
    s = engine.stats()
    assert (s["requests"], s["completed"], s["blocks_held"]) == (4, 4, 28)
    assert s["prompt_tokens"] == 2 * 229 + 2 * 224 and s["cached_tokens"] == 14 * 16 + 13 * 16


def test_prefix_sharing_counts_shared_full_blocks():
    clock = VirtualClock()
    engine = make_engine(clock)
    turn1 = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
    complete(engine, clock, turn1)
    turn2 = turn1 + [{"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Spain?"}]
    assert render_transcript(turn2).startswith(render_transcript(turn1))  # multi-turn reuse
    assert complete(engine, clock, turn2).cached_tokens == len(render_transcript(turn1)) // 16 * 16
    sibling = [SYSTEM, {"role": "user", "content": "What is the capital of Peru?"}]
    shared = len(commonprefix([render_transcript(sibling), render_transcript(turn1)]))
    assert complete(engine, clock, sibling).cached_tokens == shared // 16 * 16 > 0


def test_lru_eviction_under_small_capacity_keeps_heads():
    clock = VirtualClock()
    engine = make_engine(clock, capacity_tokens=20 * 16)
    a, b = user("a" * 205), user("b" * 205)  # 14 blocks each, no block in common
    complete(engine, clock, a)
    complete(engine, clock, b)
    s = engine.stats()
    assert (s["blocks_held"], s["evicted_blocks"], s["capacity_blocks"]) == (20, 8, 20)
    assert engine.lookup(engine.request(a)) == 6 * 16  # a lost its 8 tail blocks, kept its head
    assert complete(engine, clock, a).cached_tokens == 6 * 16
    assert engine.lookup(engine.request(b)) < 14 * 16  # re-inserting a evicted b's tail
    engine.reset()
    s = engine.stats()
    assert (s["blocks_held"], s["requests"], s["evicted_blocks"]) == (0, 0, 0)
    assert complete(engine, clock, a).cached_tokens == 0


def test_event_callbacks_describe_the_cache():
    clock = VirtualClock()
    stored: list[tuple[list[int], list[int], int | None]] = []
    removed: list[list[int]] = []
    engine = make_engine(
        clock, capacity_tokens=20 * 16, on_stored=lambda h, t, p: stored.append((h, t, p)), on_removed=removed.append
    )
    base = user("a" * 205)
    req = engine.request(base)
    complete(engine, clock, base)
    assert stored == [(req.hashes, req.tokens[: 14 * 16], None)]
    longer = base + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more " * 20}]
    req2 = engine.request(longer)
    k = len(render_transcript(base)) // 16  # blocks shared with base
    complete(engine, clock, longer)
    new = stored[-1]
    assert new == (req2.hashes[k:20], req2.tokens[k * 16 : 20 * 16], req2.hashes[k - 1])
    assert removed == [] and engine.stats()["blocks_held"] == 20
    complete(engine, clock, user("b" * 205))
    assert len(removed[-1]) == 14 and not set(removed[-1]) & set(engine.held_hashes())
    held = engine.held_hashes()
    engine.reset()
    assert sorted(removed[-1]) == sorted(held)  # no on_cleared: reset reports every block
    cleared: list[bool] = []
    engine.on_cleared = lambda: cleared.append(True)
    engine.reset()
    assert cleared == [True]


def test_events_keep_a_router_prefix_index_exact():
    clock = VirtualClock()
    index = PrefixIndex()
    index.add_replica("r1")
    applier = EventApplier(index, "r1", block_size=16)

    class Direct:  # a publisher that applies each batch in-process
        def publish(self, events: list[Any]) -> None:
            for ev in events:
                applier.apply(ev)

    engine = make_engine(clock, capacity_tokens=24 * 16, **publisher_callbacks(Direct(), 16))
    prompts = [user("a" * 205), [SYSTEM] + user("q1"), user("b" * 205), [SYSTEM] + user("q2"), user("a" * 300)]
    for p in prompts:
        complete(engine, clock, p)
        for q in prompts:
            hashes = engine.request(q).hashes
            assert index.match(hashes)["r1"] == engine._cache.match(hashes)
    assert index.blocks("r1") == engine.stats()["blocks_held"]
    engine.reset()
    assert index.blocks("r1") == 0


# -- timing model ---------------------------------------------------------------------------------


def test_fifo_prefill_queue_and_concurrent_decode():
    clock = VirtualClock()
    engine = make_engine(clock, overhead_s=0.002)  # 1000 tok/s prefill, 100 tok/s decode
    p, q = user("p" * 200), user("q" * 200)  # 224 tokens each
    done: dict[str, float] = {}
    probes: dict[float, dict[str, Any]] = {}

    async def go(tag: str, msgs: list[dict[str, Any]]):
        info = await engine.complete(engine.request(msgs))
        done[tag] = clock.now
        return info

    async def probe(t: float) -> None:
        await clock.sleep(t)
        probes[t] = engine.stats()

    r1, r2, r3, *_ = clock.run(go("r1", p), go("r2", p), go("r3", q), probe(0.1), probe(0.3))
    assert (r1.queue_s, r1.cached_tokens) == (0, 0) and r1.prefill_s == pytest.approx(0.226)
    # r2 was queued behind r1 and its prefill started after r1's: it reuses r1's blocks
    assert r2.queue_s == pytest.approx(0.226) and r2.cached_tokens == 208
    assert r2.prefill_s == pytest.approx(0.002 + 16 / 1000) and r2.ttft_s == pytest.approx(0.244)
    assert r3.queue_s == pytest.approx(0.244) and r3.ttft_s == pytest.approx(0.470) and r3.cached_tokens == 0
    # decode (16 tokens at 100/s) overlaps other requests' prefill and decode
    assert done == pytest.approx({"r1": 0.386, "r2": 0.404, "r3": 0.630})
    assert {k: probes[0.1][k] for k in ("queue_len", "prefilling", "in_flight")} == {
        "queue_len": 2,
        "prefilling": 1,
        "in_flight": 3,
    }
    assert {k: probes[0.3][k] for k in ("queue_len", "prefilling", "in_flight")} == {
        "queue_len": 0,
        "prefilling": 1,
        "in_flight": 3,
    }
    s = engine.stats()
    assert (s["queue_len"], s["in_flight"], s["completed"]) == (0, 0, 3)
    assert s["prefill_busy_s"] == pytest.approx(0.470)


def test_cancel_while_queued_leaves_queue_and_cache_alone():
    clock = VirtualClock()
    engine = make_engine(clock, overhead_s=0.0)
    p, q = user("p" * 200), user("q" * 200)

    async def cancel_second(t: float) -> None:
        await clock.sleep(t)
        assert engine.stats()["queue_len"] == 2
        clock.tasks[1].cancel()

    r1, r2, r3, _ = clock.run(
        engine.complete(engine.request(p)),
        engine.complete(engine.request(q)),
        engine.complete(engine.request(p)),
        cancel_second(0.05),
    )
    assert r2 is None and clock.tasks[1].cancelled()
    assert r3.queue_s == pytest.approx(0.224) and r3.cached_tokens == 208
    s = engine.stats()
    assert (s["requests"], s["completed"], s["queue_len"], s["in_flight"]) == (3, 2, 0, 0)
    assert s["prompt_tokens"] == 2 * 224 and s["blocks_held"] == 14


def test_stream_steps_spread_decode():
    clock = VirtualClock()
    engine = make_engine(clock, overhead_s=0.0, decode_tps=10.0)

    async def steps(n: int) -> list[tuple[int, int, float]]:
        out = []
        async for step in engine.generate(engine.request(user("z" * 76), n), pieces=4):  # 100 tokens
            out.append((step.start, step.end, clock.now))
        out.append((-1, -1, clock.now))  # when the generator finished
        return out

    (nine,) = clock.run(steps(9))
    assert [(s, e) for s, e, _ in nine] == [(0, 1), (1, 3), (3, 5), (5, 7), (7, 9), (-1, -1)]
    ttft = 0.1  # 100 uncached tokens at 1000/s
    assert [t for *_, t in nine] == pytest.approx(
        [ttft, ttft + 0.225, ttft + 0.45, ttft + 0.675, ttft + 0.9, ttft + 0.9]
    )
    (one,) = clock.run(steps(1))
    assert [(s, e) for s, e, _ in one] == [(0, 1), (-1, -1)]
    assert one[1][2] - one[0][2] == pytest.approx(0.1)  # 1 token at 10/s


# -- HTTP ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def replica() -> Iterator[ServerThread]:
    engine = SimEngine(1_000_000, 16, prefill_tps=2e6, decode_tps=1e4, overhead_s=0.0)
    server = ServerThread(create_sim_app(engine, "r1")).start()
    yield server
    server.stop()


@pytest.fixture
def fresh(replica: ServerThread) -> ServerThread:
    httpx.post(f"{replica.url}/reset").raise_for_status()
    return replica


def test_openai_client_reports_cached_tokens(fresh: ServerThread):
    client = OpenAI(base_url=f"{fresh.url}/v1", api_key="none")
    msgs = [SYSTEM, {"role": "user", "content": "Tell me about caching."}]
    raw = client.chat.completions.with_raw_response.create(model="any", messages=msgs, max_tokens=7)
    assert raw.headers["x-sim-replica"] == "r1" and raw.headers["x-sim-cached-tokens"] == "0"
    first = raw.parse()
    assert first.usage.prompt_tokens == len(render_transcript(msgs)) and first.usage.completion_tokens == 7
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert first.choices[0].message.content == " ".join(answer_words("r1", 7)) and first.model == "any"
    again = client.chat.completions.create(model="any", messages=msgs, max_tokens=7)
    assert again.usage.prompt_tokens_details.cached_tokens == len(render_transcript(msgs)) // 16 * 16 > 0
    assert again.usage.total_tokens == again.usage.prompt_tokens + 7


def test_openai_client_streams(fresh: ServerThread):
    client = OpenAI(base_url=f"{fresh.url}/v1", api_key="none")
    msgs = user("Stream me something. " * 10)
    usages = []
    for _ in range(2):
        chunks = list(
            client.chat.completions.create(
                model="any", messages=msgs, stream=True, max_tokens=40, stream_options={"include_usage": True}
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == " ".join(answer_words("r1", 40))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        usages.append(chunks[-1].usage)
    assert usages[0].prompt_tokens_details.cached_tokens == 0
    assert usages[1].prompt_tokens_details.cached_tokens == len(render_transcript(msgs)) // 16 * 16
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) <= 1 + sim.STREAM_PIECES
    # without include_usage the usage rides on the finish chunk
    with httpx.stream(
        "POST",
        f"{fresh.url}/v1/chat/completions",
        json={"model": "m", "messages": msgs, "stream": True, "max_tokens": 3},
    ) as r:
        assert r.headers["x-sim-replica"] == "r1"
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    final = json.loads(events[-2])
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 and final["usage"]["completion_tokens"] == 3


def test_litellm_sees_cached_tokens(fresh: ServerThread):
    kw = {"model": "openai/x", "api_base": f"{fresh.url}/v1", "api_key": "none"}
    msgs = [SYSTEM, {"role": "user", "content": "Via LiteLLM, please."}]
    first = litellm.completion(messages=msgs, **kw)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = litellm.completion(messages=msgs, **kw)
    assert second.usage.prompt_tokens_details.cached_tokens == len(render_transcript(msgs)) // 16 * 16 > 0
    chunks = list(litellm.completion(messages=msgs, stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == " ".join(answer_words("r1", 16))
    built = litellm.stream_chunk_builder(chunks, messages=msgs)
    assert built.usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens_details.cached_tokens


class InstantClock:
    """Virtual time for an engine behind a real server: sleep() moves the clock at once (and
    yields), so the engine's own TTFTs are exact and nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def time(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)
        self.now += max(0.0, delay)
        await asyncio.sleep(0)


def test_ttft_follows_the_cache_and_queue():
    """A slow replica (4000 uncached tokens ≈ 0.2 s of modelled prefill) on a virtual clock: a
    streamed answer's first token comes after the prefill the engine waited, which the cache
    shortens; cached and queued counts are exact."""
    clock = InstantClock()
    engine = SimEngine(
        1_000_000, 16, prefill_tps=20_000, decode_tps=1e4, overhead_s=0.0, clock=clock.time, sleep=clock.sleep
    )
    server = ServerThread(create_sim_app(engine, "slow")).start()
    try:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        msgs = user("w" * 4000)
        tokens = len(render_transcript(msgs))
        cold_prefill = tokens / 20_000
        warm_prefill = (tokens - tokens // 16 * 16) / 20_000  # only the partial last block is not cached

        def ttft() -> float:
            with client.chat.completions.create(model="m", messages=msgs, stream=True, max_tokens=2) as stream:
                # read to the end: an abandoned stream can deadlock httpcore's pool on GC
                content = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
            assert content
            return engine.ttfts()[-1]  # the engine's, on the virtual clock

        cold = ttft()
        assert clock.slept[0] == pytest.approx(cold_prefill)  # the first token waited the whole prefill
        warm = ttft()
        assert cold == pytest.approx(cold_prefill) and warm == pytest.approx(warm_prefill)
        assert warm < cold / 2
        # concurrent identical requests: FIFO prefill, each after the first reuses the cache
        engine.reset()
        results: list[Any] = []
        threads = [
            threading.Thread(
                target=lambda: results.append(
                    client.chat.completions.with_raw_response.create(model="m", messages=msgs, max_tokens=2)
                )
            )
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cached = sorted(int(r.headers["x-sim-cached-tokens"]) for r in results)
        assert cached == [0, len(render_transcript(msgs)) // 16 * 16, len(render_transcript(msgs)) // 16 * 16]
        assert max(float(r.headers["x-sim-prefill-ms"]) for r in results) == pytest.approx(
            cold_prefill * 1000, rel=1e-3
        )
    finally:
        server.stop()


def test_errors_and_admin_endpoints(fresh: ServerThread):
    http = httpx.Client(base_url=fresh.url)
    bad = http.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert bad.headers["x-sim-replica"] == "r1"
    for body, param in (
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": "hi"}, "messages"),
        ({"model": "m", "messages": user("hi"), "max_tokens": 0}, "max_tokens"),
    ):
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert http.get("/v1/models").json()["data"][0]["id"] == "sim"
    http.post("/v1/chat/completions", json={"model": "m", "messages": user("count me " * 5)}).raise_for_status()
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["name"] == "r1" and health["requests"] == 1
    stats = http.get("/stats").json()
    assert stats["blocks_held"] > 0 and stats["in_flight"] == 0 and stats["prompt_tokens"] > 0
    reset = http.post("/reset").json()
    assert reset["blocks_held"] == 0 and reset["requests"] == 0


# -- command line and ZMQ events ------------------------------------------------------------------


def test_cli_options_build_the_engine(capsys: pytest.CaptureFixture[str]):
    parser = argparse.ArgumentParser()
    sim.add_arguments(parser)
    args = parser.parse_args(
        [
            "--port",
            "0",
            "--capacity-tokens",
            "4096",
            "--prefill-tps",
            "5e4",
            "--decode-tps",
            "80",
            "--block-size",
            "32",
            "--overhead-ms",
            "5",
        ]
    )
    engine = sim.build_engine(args)
    assert (engine.block_size, engine.prefill_tps, engine.decode_tps, engine.overhead_s) == (32, 5e4, 80, 0.005)
    assert engine.stats()["capacity_blocks"] == 128 and args.events_endpoint is None
    assert sim.main(["--port", "0", "--capacity-tokens", "1", "--prefill-tps", "0", "--decode-tps", "1"]) == 2
    assert "must be positive" in capsys.readouterr().err


def test_zmq_events_feed_a_subscriber():
    publisher = ZmqEventPublisher("tcp://127.0.0.1:*")
    index = PrefixIndex()
    index.add_replica("r1")
    subscriber = ZmqEventSubscriber(publisher.endpoint, EventApplier(index, "r1", block_size=16)).start()
    try:
        deadline = time.time() + 5
        while subscriber.stats()["batches"] == 0:  # ZMQ slow joiner: wait until batches arrive
            assert time.time() < deadline, "subscriber never connected"
            publisher.publish([])
            time.sleep(0.01)
        clock = VirtualClock()
        engine = make_engine(clock, **publisher_callbacks(publisher, 16))
        msgs = [SYSTEM] + user("published")
        complete(engine, clock, msgs)
        hashes = engine.request(msgs).hashes
        while index.match(hashes)["r1"] < len(hashes):
            assert time.time() < deadline, "events not applied"
            time.sleep(0.01)
        engine.reset()  # AllBlocksCleared
        while index.blocks("r1"):
            assert time.time() < deadline, "clear not applied"
            time.sleep(0.01)
        assert subscriber.stats()["decode_errors"] == 0 and subscriber.stats()["gaps"] == 0
    finally:
        subscriber.stop()
        publisher.close()
