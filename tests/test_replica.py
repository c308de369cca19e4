"""The reference CPU replica: the real SmolLM2-135M model, a real ChunkStore (RAM + disk tiers).

Checks that KV loaded from the store (RAM, disk only, after a restart) gives token-for-token the
same greedy answer as a cold prefill, that a second conversation turn reuses the first turn's
chunks, that events follow vLLM's BlockStored semantics in the router's hash space, and the HTTP
face with the openai client and real LiteLLM. The model is loaded once for the module; prompts
are ~700 tokens (2-3 chunks of 256) and answers short, to keep the file quick on two cores.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx
import litellm
import pytest
import torch
from openai import OpenAI

from kvgate.engines.api import InvalidRequest, publisher_callbacks
from kvgate.engines.replica import runner
from kvgate.engines.replica.engine import ReplicaEngine
from kvgate.engines.replica.model import load_model, model_namespace
from kvgate.engines.replica.server import create_replica_app
from kvgate.engines.replica.text import StopMatcher
from kvgate.index.kv.chunks import ChunkStore, DiskTier, MemoryTier, chunk_hashes
from kvgate.index.kv.hashing import block_hashes
from kvgate.index.kv.kv_events import MEDIUM_CPU, BlockStored, EventApplier, ZmqEventPublisher, ZmqEventSubscriber
from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import load_tokenizer
from kvgate.tools.bench.procs import ServerThread

CT = 256
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
PARIS = "The capital of France is Paris."


def long_chat(n_facts: int = 40, question: str = "What is 7 squared? Answer briefly.") -> list[dict[str, Any]]:
    facts = " ".join(f"Fact {i}: the number {i} squared is {i * i}." for i in range(n_facts))
    return [
        {"role": "system", "content": "You answer from the facts given."},
        {"role": "user", "content": f"{facts}\n{question}"},
    ]


@pytest.fixture(scope="module")
def model_and_tokenizer() -> tuple[Any, Any]:
    return load_model("smollm2")


def make_store(kv_dir: Path, ram_mb: int = 256, disk_mb: int = 512) -> ChunkStore:
    return ChunkStore([MemoryTier(ram_mb << 20), DiskTier(kv_dir, disk_mb << 20)], namespace="smollm2-135m:float32")


@pytest.fixture
def engines(model_and_tokenizer: tuple[Any, Any]) -> Iterator[Any]:
    """make(store=None, **kw) -> ReplicaEngine; everything made is closed afterwards."""
    made: list[Any] = []

    def make(store: ChunkStore | None = None, **kw: Any) -> ReplicaEngine:
        model, tok = model_and_tokenizer
        engine = ReplicaEngine(model, tok, store, chunk_tokens=CT, **kw)
        made.append(engine)
        if store is not None:
            made.append(store)
        return engine

    yield make
    for thing in made:
        thing.close()


def test_greedy_answer_and_namespace(engines: Any, model_and_tokenizer: tuple[Any, Any]) -> None:
    engine = engines()
    assert model_namespace(model_and_tokenizer[0]) == "smollm2-135m:float32"
    c = engine.generate(FRANCE, max_tokens=16)
    assert c.text == PARIS
    assert c.finish_reason == "stop" and c.cached_tokens == 0 and c.prompt_tokens == 37
    # the ids the replica feeds are the ids the router hashes
    router = PromptHasher(load_tokenizer("smollm2"), CT)
    chat = long_chat()
    assert engine.tokens(chat) == router.tokens(chat)


def test_kv_from_ram_disk_and_restart_matches_cold(engines: Any, tmp_path: Path) -> None:
    chat = long_chat()
    engine = engines(make_store(tmp_path))
    cold = engine.generate(chat, max_tokens=12)
    assert cold.cached_tokens == 0 and cold.prompt_tokens > 2 * CT
    assert cold.stored_chunks == (cold.prompt_tokens + cold.completion_tokens - 1) // CT

    warm = engine.generate(chat, max_tokens=12)  # RAM: full chunks + the partial tail after them
    loadable = (cold.prompt_tokens - 1) // CT * CT
    assert warm.cached_tokens == cold.prompt_tokens - 1  # everything but the token that must be fed
    assert warm.token_ids == cold.token_ids and warm.text == cold.text

    engine.store.clear("memory")  # disk only: the RAM tail goes too, its spilled copy stays
    engine.tails.clear()
    disk = engine.generate(chat, max_tokens=12)
    assert disk.cached_tokens == cold.prompt_tokens - 1 and disk.token_ids == cold.token_ids
    assert engine.store.stats()["hits"]["disk"] >= loadable // CT
    assert engine.tails.stats()["spill_hits"] == 1

    restarted = engines(make_store(tmp_path))  # a new process would see the same directory
    again = restarted.generate(chat, max_tokens=12)
    assert again.cached_tokens == cold.prompt_tokens - 1 and again.token_ids == cold.token_ids

    # a damaged spilled tail is dropped and recomputed: full chunks only, same answer
    chunk_file_size = len(restarted.store.tiers[1].get(restarted.store.key(chunk_hashes(engine.tokens(chat), CT)[0])))
    tail_files = [p for p in tmp_path.rglob("*.val") if p.stat().st_size != chunk_file_size]
    assert len(tail_files) == 1
    raw = bytearray(tail_files[0].read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    tail_files[0].write_bytes(bytes(raw))
    damaged = engines(make_store(tmp_path))
    third = damaged.generate(chat, max_tokens=12)
    assert third.token_ids == cold.token_ids and third.cached_tokens == loadable
    assert damaged.tails.stats()["spill_corrupt"] == 1


def test_exact_prefill_loaded_kv_gives_bitwise_cold_logits(
    engines: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engines(make_store(tmp_path), exact_prefill=True)
    first_logits: list[torch.Tensor] = []
    sample = runner.sample
    monkeypatch.setattr(
        runner, "sample", lambda logits, *a: (first_logits.append(logits.clone()), sample(logits, *a))[1]
    )
    chat = long_chat(36)
    cold = engine.generate(chat, max_tokens=1)  # cold: stores the prompt's chunks
    warm = engine.generate(chat, max_tokens=1)
    assert cold.cached_tokens == 0 and warm.cached_tokens == (cold.prompt_tokens - 1) // CT * CT >= 2 * CT
    assert torch.equal(first_logits[0], first_logits[1])


def test_second_turn_reuses_first_turn_chunks(engines: Any, tmp_path: Path) -> None:
    engine = engines(make_store(tmp_path))
    turn1 = long_chat(44, "Explain what 7 squared is, in a full sentence.")  # 760 tokens + ~19
    first = engine.generate(turn1, max_tokens=24)
    turn2 = turn1 + [
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "And what is 8 squared?"},
    ]
    second = engine.generate(turn2, max_tokens=8)
    assert second.cached_tokens >= first.prompt_tokens // CT * CT
    # exactly the chunks turn 1 left in the cache (prompt + answer but its last token) that
    # turn 2's prompt starts with: chunks holding answer tokens are reused too, since the
    # answer re-tokenizes to the same ids
    # the cache holds every fed token: all answer tokens when it stopped on EOS, all but the last
    # when it hit max_tokens
    fed = first.prompt_tokens + first.completion_tokens - (first.finish_reason == "length")
    held = (engine.tokens(turn1) + list(first.token_ids))[:fed]
    ids2 = engine.tokens(turn2)
    common = next((i for i, (a, b) in enumerate(zip(held, ids2)) if a != b), min(len(held), len(ids2)))
    # full chunks from the store, then the RAM tail up to where turn 2 departs from turn 1
    assert second.cached_tokens == min(common, len(ids2) - 1) > 3 * CT
    assert len(held) >= 3 * CT, "the answer should cross a chunk boundary"
    assert engine.tails.stats()["hits"] >= 1
    fresh = engines()  # no store, no tails: a cold run of turn 2
    assert fresh.generate(turn2, max_tokens=8).token_ids == second.token_ids


def test_events_follow_the_chain_in_router_hash_space(engines: Any, tmp_path: Path) -> None:
    events: list[tuple[list[int], list[int], int | None]] = []
    engine = engines(make_store(tmp_path), on_stored=lambda h, t, p: events.append((h, t, p)))
    chat = long_chat(30)
    first = engine.generate(chat, max_tokens=4)
    engine.generate(chat, max_tokens=4)  # nothing new: no event
    assert len(events) == 1
    hashes, tokens, parent = events[0]
    assert parent is None and len(tokens) == len(hashes) * CT
    ids = engine.tokens(chat)
    assert hashes == block_hashes(ids, CT)[: len(hashes)] and tokens == ids[: len(tokens)]
    assert len(hashes) == (first.prompt_tokens + first.completion_tokens - 1) // CT

    index = PrefixIndex()
    index.add_replica("r1")
    applier = EventApplier(index, "r1", block_size=CT)
    for h, t, p in events:
        applier.apply(BlockStored(block_hashes=h, parent_block_hash=p, token_ids=t, block_size=CT))
    router_hashes, _ = PromptHasher(load_tokenizer("smollm2"), CT).hashes(chat)
    assert applier.stats()["stored"] == len(hashes)
    assert [applier.our_hash(h) for h in hashes] == router_hashes[: len(hashes)]


def test_store_eviction_reaches_a_subscriber_as_block_removed(engines: Any) -> None:
    """A RAM-only store of two chunks: a second conversation evicts the first one's chunks, the
    replica publishes BlockRemoved (medium CPU) over real ZMQ, and the router's index drops them."""
    pub = ZmqEventPublisher("tcp://127.0.0.1:*")
    index = PrefixIndex()
    index.add_replica("r1")
    applier = EventApplier(index, "r1", block_size=CT)
    sub = ZmqEventSubscriber(pub.endpoint, applier).start()
    try:
        deadline = time.monotonic() + 5
        while sub.stats()["batches"] == 0 and time.monotonic() < deadline:  # slow joiner: until one arrives
            pub.publish([])
            time.sleep(0.02)
        assert sub.stats()["batches"] > 0
        cb = publisher_callbacks(pub, CT, medium=MEDIUM_CPU)
        store = ChunkStore([MemoryTier(30 << 20)], namespace="smollm2-135m:float32")  # 2 chunks of ~11.8 MB
        engine = engines(store, on_stored=cb["on_stored"], on_removed=cb["on_removed"])
        hasher = PromptHasher(load_tokenizer("smollm2"), CT)
        first = long_chat(40)
        second = [{"role": "system", "content": "Answer in one word."}, first[1]]
        first_hashes, _ = hasher.hashes(first)
        second_hashes, _ = hasher.hashes(second)

        def wait_for(cond: Any) -> bool:
            end = time.monotonic() + 10
            while not cond() and time.monotonic() < end:
                time.sleep(0.02)
            return cond()

        engine.generate(first, max_tokens=4)
        assert wait_for(lambda: index.match(first_hashes)["r1"] == 2)
        engine.generate(second, max_tokens=4)  # its two chunks push the first two out of RAM
        assert wait_for(lambda: index.match(second_hashes)["r1"] == 2)
        assert wait_for(lambda: index.match(first_hashes)["r1"] == 0)
        assert store.stats()["removed"] == 2 and index.blocks("r1") == 2
        s = sub.stats()
        assert s["blocks_removed"] == 2 and s["gaps"] == 0 and s["resyncs"] == 0
        assert applier.media(block_hashes(engine.tokens(second), CT)[0]) == {MEDIUM_CPU}
    finally:
        sub.stop()
        pub.close()


def test_sampling_and_stop_strings(engines: Any) -> None:
    engine = engines()
    a = engine.generate(FRANCE, max_tokens=8, temperature=0.9, seed=7)
    b = engine.generate(FRANCE, max_tokens=8, temperature=0.9, seed=7, top_p=0.9)
    c = engine.generate(FRANCE, max_tokens=8, temperature=0.9, seed=7)
    assert a.token_ids == c.token_ids and a.completion_tokens >= 1 and b.completion_tokens >= 1
    stopped = engine.generate(FRANCE, max_tokens=16, stop=[" Paris"])
    assert stopped.text == "The capital of France is" and stopped.finish_reason == "stop"
    assert "".join(engine.stream(FRANCE, max_tokens=16, stop=["France"])) == "The capital of "
    with pytest.raises(InvalidRequest):
        engine.generate(FRANCE, max_tokens=5000)
    with pytest.raises(InvalidRequest):
        engine.generate(FRANCE, max_tokens=8, top_p=0)


def test_stop_matcher_holds_back_partial_stops() -> None:
    m = StopMatcher(["END"])
    assert m.feed("abc E") == "abc " and m.feed("N") == "" and m.feed("x") == "ENx"
    assert m.feed("yEND tail") == "y" and m.stopped and m.text == "abc ENxy"
    assert StopMatcher([]).feed("anything") == "anything"


# -- HTTP -------------------------------------------------------------------------------------------


@pytest.fixture
def replica(engines: Any, tmp_path: Path) -> Iterator[tuple[ServerThread, ReplicaEngine]]:
    engine = engines(make_store(tmp_path))
    server = ServerThread(create_replica_app(engine, "r1")).start()
    yield server, engine
    server.stop()


def test_http_openai_litellm_and_errors(replica: tuple[ServerThread, ReplicaEngine]) -> None:
    server, _ = replica
    client = OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(model="smollm2", messages=FRANCE, max_tokens=16)
    assert r.choices[0].message.content == PARIS and r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == 37 and r.usage.prompt_tokens_details.cached_tokens == 0

    chat = long_chat(36)
    cold = client.chat.completions.create(model="smollm2", messages=chat, max_tokens=8)
    pieces, usage = [], None
    for chunk in client.chat.completions.create(
        model="smollm2", messages=chat, max_tokens=8, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    assert "".join(pieces) == cold.choices[0].message.content
    assert usage is not None and usage.prompt_tokens == cold.usage.prompt_tokens
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1 > CT  # chunks + RAM tail

    resp = litellm.completion(
        model="openai/x", api_base=f"{server.url}/v1", api_key="none", messages=FRANCE, max_tokens=16
    )
    assert resp.choices[0].message.content == PARIS

    http = httpx.Client(base_url=server.url, timeout=30)
    for body in (
        b"{not json",
        json.dumps({"model": "x", "messages": []}).encode(),
        json.dumps({"model": "x", "messages": FRANCE, "max_tokens": 5000}).encode(),
        json.dumps({"model": "x", "messages": FRANCE, "temperature": "hot"}).encode(),
    ):
        bad = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert bad.status_code == 400, body
        assert bad.json()["error"]["type"] == "invalid_request_error"
    assert http.get("/v1/models").json()["data"][0]["id"] == "smollm2"
    metrics = http.get("/metrics").text
    assert "kvgate_replica_cached_tokens_total" in metrics and "kvgate_replica_prefill_seconds" in metrics
    assert http.get("/health").headers["x-kvgate-replica"] == "r1"
    http.close()


def _scrape(http: httpx.Client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """/metrics as {(sample name, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(http.get("/metrics").text)
        for s in family.samples
    }


def test_metrics_export_kv_store_counters_per_tier(replica: tuple[ServerThread, ReplicaEngine]) -> None:
    server, engine = replica
    http = httpx.Client(base_url=server.url, timeout=60)
    chat = {"model": "x", "messages": long_chat(), "max_tokens": 4}
    first = http.post("/v1/chat/completions", json=chat).json()["usage"]
    second = http.post("/v1/chat/completions", json=chat).json()["usage"]
    loadable = (first["prompt_tokens"] - 1) // CT  # chunks the second request reads from RAM
    stored = (first["prompt_tokens"] + first["completion_tokens"] - 1) // CT
    assert loadable >= 2 and second["completion_tokens"] == first["completion_tokens"]

    m = _scrape(http)

    def value(name: str, **labels: str) -> float:
        return m[(name, frozenset(labels.items()))]

    assert value("kvgate_replica_kv_chunk_queries_total", tier="memory") == loadable
    assert value("kvgate_replica_kv_chunk_hits_total", tier="memory") == loadable
    assert value("kvgate_replica_kv_chunk_queries_total", tier="disk") == 0  # RAM answered every read
    assert value("kvgate_replica_kv_chunk_hits_total", tier="disk") == 0
    assert value("kvgate_replica_kv_chunk_misses_total") == 0
    assert value("kvgate_replica_kv_chunk_writes_total", tier="memory") == stored
    assert value("kvgate_replica_kv_chunk_writes_total", tier="disk") == stored
    assert value("kvgate_replica_stored_chunks_total") == stored
    assert value("kvgate_replica_kv_chunks_damaged_total", tier="disk") == 0
    assert value("kvgate_replica_kv_storage_failures_total", tier="disk", kind="write") == 0
    assert value("kvgate_replica_kv_objects", tier="memory") == stored
    assert value("kvgate_replica_kv_bytes", tier="memory") > 0
    assert value("kvgate_replica_kv_evictions_total", tier="memory") == 0
    assert value("kvgate_replica_kv_tail_hits_total", tier="memory") == 1  # the second request's partial chunk

    # chunk 0 damaged on disk, RAM emptied: the next read goes to disk, fails verification, is a miss
    store, disk = engine.store, engine.store.tiers[1]
    key = store.key(chunk_hashes(engine.tokens(chat["messages"]), CT)[0])
    raw = bytearray(disk.get(key))
    raw[len(raw) // 2] ^= 0xFF
    disk.delete(key)
    assert disk.put(key, bytes(raw))
    store.clear("memory")
    engine.tails.clear()
    third = http.post("/v1/chat/completions", json=chat).json()["usage"]
    assert third["prompt_tokens_details"]["cached_tokens"] == 0
    m = _scrape(http)
    assert value("kvgate_replica_kv_chunks_damaged_total", tier="disk") == 1
    assert value("kvgate_replica_kv_chunks_damaged_total", tier="memory") == 0
    assert value("kvgate_replica_kv_chunk_queries_total", tier="memory") == loadable + 1
    assert value("kvgate_replica_kv_chunk_queries_total", tier="disk") == 1
    assert value("kvgate_replica_kv_chunk_misses_total") == 1
    # recomputed: chunk 0 rewritten everywhere, the others only into the emptied RAM tier
    assert value("kvgate_replica_kv_chunk_writes_total", tier="memory") == 2 * stored
    assert value("kvgate_replica_kv_chunk_writes_total", tier="disk") == stored + 1
    assert value("kvgate_replica_stored_chunks_total") == stored + 1
    http.close()


def test_disconnect_cancels_and_health_stays_responsive(replica: tuple[ServerThread, ReplicaEngine]) -> None:
    server, engine = replica
    http = httpx.Client(base_url=server.url, timeout=30)
    body = {
        "model": "x",
        "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
        "max_tokens": 400,
        "stream": True,
    }
    with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["delta"]["role"] == "assistant"
        health = http.get("/health", timeout=10)  # while the model is decoding
        # answered mid-generation (running 1): the decode does not hold the server's event loop
        assert health.status_code == 200 and health.json()["running"] == 1
        assert json.loads(next(line for line in lines if line.startswith("data: "))[6:])["choices"]  # and it goes on
    deadline = time.time() + 15
    while engine.stats()["cancelled"] < 1 and time.time() < deadline:
        time.sleep(0.05)
    stats = engine.stats()
    assert stats["cancelled"] == 1 and stats["running"] == 0
    assert stats["completion_tokens"] < 200
    # a non-streaming client that gives up cancels too
    with pytest.raises(httpx.ReadTimeout):
        http.post("/v1/chat/completions", json={**body, "stream": False}, timeout=1.5)
    deadline = time.time() + 15
    while engine.stats()["cancelled"] < 2 and time.time() < deadline:
        time.sleep(0.05)
    assert engine.stats()["cancelled"] == 2 and engine.stats()["completion_tokens"] < 400
    # the engine keeps serving after a cancel
    ok = http.post("/v1/chat/completions", json={"model": "x", "messages": FRANCE, "max_tokens": 16}).json()
    assert ok["choices"][0]["message"]["content"] == PARIS
    http.close()


def test_a_cached_turn_is_not_queued_behind_cold_prompts(engines: Any, tmp_path: Path) -> None:
    from kvgate.engines.replica.engine import SamplingParams

    engine = engines(make_store(tmp_path))
    warm_chat = long_chat(40, "What is 3 squared?")
    engine.generate(warm_chat, max_tokens=1)  # its chunks are now stored
    done: list[str] = []
    finished = threading.Event()

    def sink(name: str) -> Any:
        def on(event: Any) -> None:
            if not isinstance(event, str):
                done.append(name)
                if len(done) == 3:
                    finished.set()

        return on

    params = SamplingParams(max_tokens=1)
    for name, chat in (
        ("cold-1", long_chat(41, "What is 5 squared?")),
        ("cold-2", long_chat(42, "What is 6 squared?")),
        ("warm", warm_chat),
    ):
        engine.submit(engine.prepare(chat, params), params, sink(name))
    assert finished.wait(300)
    # whichever cold prompt the worker took first, the cached one runs before the other
    assert done.index("warm") < done.index("cold-2")


class _Recorder:
    """Sinks that log (name, "piece" | "end") in the order the worker emits them."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.results: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)

    def sink(self, name: str) -> Any:
        def on(event: Any) -> None:
            with self._lock:
                self.log.append((name, "piece" if isinstance(event, str) else "end"))
                if not isinstance(event, str):
                    self.results[name] = event
                    self._done.notify_all()

        return on

    def wait(self, n: int, timeout: float = 300) -> None:
        with self._lock:
            assert self._done.wait_for(lambda: len(self.results) >= n, timeout)

    def first(self, name: str) -> int:
        return next(i for i, (who, _) in enumerate(self.log) if who == name)

    def end(self, name: str) -> int:
        return self.log.index((name, "end"))


def test_a_cached_turn_preempts_a_running_cold_prefill(engines: Any, tmp_path: Path) -> None:
    from kvgate.engines.replica.engine import SamplingParams

    engine = engines(make_store(tmp_path))
    warm_chat = long_chat(40, "What is 3 squared?")
    engine.generate(warm_chat, max_tokens=1)  # its chunks are now stored
    rec, params = _Recorder(), SamplingParams(max_tokens=4)
    cold_chat = [{"role": "system", "content": "Be brief."}, *long_chat(90, "What is 9 squared?")[1:]]  # ~1500 tokens
    engine.submit(engine.prepare(cold_chat, params), params, rec.sink("cold"))
    deadline = time.time() + 60
    while engine.stats(store=False)["running"] < 1 and time.time() < deadline:
        time.sleep(0.005)
    engine.submit(engine.prepare(warm_chat, params), params, rec.sink("warm"))
    rec.wait(2)
    warm, cold = rec.results["warm"], rec.results["cold"]
    assert warm.cached_tokens > 0 and cold.cached_tokens == 0
    # the cached turn ran between slices of the cold prefill: its answer starts (and here even
    # ends) before the cold prompt's first token
    assert rec.first("warm") < rec.first("cold") and rec.end("warm") < rec.first("cold")
    assert warm.ttft_s < cold.ttft_s


def test_interleaved_requests_decode_together_with_solo_answers(engines: Any) -> None:
    from kvgate.engines.replica.engine import SamplingParams

    engine = engines()
    chats = {
        "dragon": [{"role": "user", "content": "Write a long story about a dragon."}],
        "ship": [{"role": "user", "content": "Write a long story about a ship."}],
        "gone": [{"role": "user", "content": "Write a long poem about rain."}],
    }
    params = SamplingParams(max_tokens=24)
    solo = {name: engine.generate(chat, params).token_ids for name, chat in chats.items() if name != "gone"}
    rec = _Recorder()
    tickets = {
        name: engine.submit(engine.prepare(chat, params), params, rec.sink(name)) for name, chat in chats.items()
    }
    deadline = time.time() + 60
    while ("gone", "piece") not in rec.log and time.time() < deadline:
        time.sleep(0.001)
    tickets["gone"].cancel()
    rec.wait(3)
    assert rec.results["gone"].finish_reason == "cancelled" and rec.results["gone"].completion_tokens < 24
    for name in solo:  # each request has its own KV cache: interleaving changes nothing
        assert rec.results[name].token_ids == solo[name] and rec.results[name].finish_reason == "length"
    # the second request did not wait for the first one's answer to end
    assert rec.first("ship") < rec.end("dragon") and rec.first("dragon") < rec.end("ship")
    assert engine.stats()["running"] == 0 and engine.stats()["queue_len"] == 0


def test_max_running_one_serves_requests_one_after_another(engines: Any) -> None:
    from kvgate.engines.replica.engine import SamplingParams

    engine = engines(max_running=1)
    params, rec = SamplingParams(max_tokens=8), _Recorder()
    for name in ("a", "b"):
        engine.submit(engine.prepare(FRANCE, params), params, rec.sink(name))
    rec.wait(2)
    assert rec.end("a") < rec.first("b") and rec.results["b"].text == rec.results["a"].text == PARIS
    with pytest.raises(ValueError, match="max_running"):
        engines(max_running=0)


def test_close_cancels_started_requests_and_fails_queued_ones(model_and_tokenizer: tuple[Any, Any]) -> None:
    from kvgate.engines.replica.engine import SamplingParams

    model, tok = model_and_tokenizer
    engine = ReplicaEngine(model, tok, None, chunk_tokens=CT, max_running=1)
    params, rec = SamplingParams(max_tokens=200), _Recorder()
    for name in ("started", "queued"):
        engine.submit(
            engine.prepare([{"role": "user", "content": "Write a long story."}], params), params, rec.sink(name)
        )
    deadline = time.time() + 60
    while ("started", "piece") not in rec.log and time.time() < deadline:
        time.sleep(0.005)
    engine.close()
    rec.wait(2, timeout=30)
    assert rec.results["started"].finish_reason == "cancelled" and rec.results["started"].completion_tokens < 200
    assert isinstance(rec.results["queued"], RuntimeError)
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit([1, 2, 3], params, rec.sink("late"))
