"""semantic.max_error_rate on the shared Redis (`store: redis`): the ObservationStore contract for
both implementations, and two real proxies (uvicorn + Pipeline + real LiteLLM + the real embedder)
on one real redis-server judging from one verified record; a dead Redis costs misses only."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvgate.index.responses.observations.base import ObservationStore
from kvgate.index.responses.observations.disk import DiskObservationStore
from kvgate.index.responses.observations.redis import RedisObservationStore
from kvgate.index.responses.trust import Observation
from kvgate.index.storage.redis_link import LinkSettings, RedisLink
from kvgate.middleware.config import parse_config
from kvgate.tools.redis_proc import RedisServer
from tests.conftest import Proxy
from tests.test_trust_e2e import PARIS, judged_lookups, same_answers, trust_config  # noqa: F401, F811  (same_answers: a fixture)


@pytest.fixture(params=["disk", "redis"])
def store(request, tmp_path: Path):
    if request.param == "disk":
        made: ObservationStore = DiskObservationStore(tmp_path / "obs", per_entry=4, per_route=5)
        yield made, None
        made.close()
        return
    server = RedisServer().start()
    link = RedisLink(LinkSettings(server.url))
    yield RedisObservationStore(link, "t:", per_entry=4, per_route=5), server
    link.close()
    server.stop()


def test_observation_store_contract(store) -> None:
    obs, _server = store
    assert isinstance(obs, ObservationStore)
    assert obs.of_entry(1) == [] and obs.pool("chat") == [] and obs.count("chat") == 0
    added = [Observation(0.5 + i / 100, i % 3 != 0) for i in range(7)]
    for o in added:
        obs.add("chat", 1, o)
    obs.add("other", 2, Observation(0.9, False))
    # the entry keeps its last per_entry, oldest first; the route's pool its last per_route
    assert obs.of_entry(1) == added[-4:]
    assert sorted(obs.pool("chat"), key=lambda o: o.similarity) == added[-5:]
    assert obs.count("chat") == 7 and obs.count("other") == 1  # the counter only grows
    assert obs.of_entry(2) == [Observation(0.9, False)] and obs.pool("other") == [Observation(0.9, False)]
    # the similarity round-trips exactly (the veto compares it with the next query's)
    obs.add("chat", 3, Observation(0.8123456789012345, True))
    assert obs.of_entry(3) == [Observation(0.8123456789012345, True)]


def test_observations_expire_with_the_entry(store) -> None:
    obs, _server = store
    obs.add("chat", 7, Observation(0.9, True), ttl=0.3)
    obs.add("chat", 8, Observation(0.9, True))
    assert len(obs.of_entry(7)) == 1
    time.sleep(0.6)
    assert obs.of_entry(7) == [] and len(obs.of_entry(8)) == 1
    assert obs.count("chat") == 2  # the pool keeps what the route learned


def test_redis_store_failures_raise_a_declared_failure(redis_server: RedisServer) -> None:
    link = RedisLink(LinkSettings(redis_server.url, op_timeout_s=0.2, connect_timeout_s=0.2))
    obs = RedisObservationStore(link)
    # a foreign or damaged row is skipped, not raised
    link.client.rpush("kvgate:o:e:5", b"garbage", b"0.9:1")
    assert obs.of_entry(5) == [Observation(0.9, True)]
    redis_server.stop()
    for call in (
        lambda: obs.of_entry(5),
        lambda: obs.count("chat"),
        lambda: obs.add("chat", 5, Observation(0.9, True)),
    ):
        with pytest.raises(obs.failures):
            call()
    link.close()


def trust_redis_config(api_base: str, cache_dir: Path, url: str) -> dict:
    return {**trust_config(api_base, cache_dir), "store": {"backend": "redis", "url": url, "follow_interval_s": 0.1}}


def test_two_proxies_judge_from_one_record(
    embedder,
    same_answers,  # noqa: F811 (the fixture)
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    cfg = lambda name: parse_config(trust_redis_config(f"{same_answers.url}/v1", tmp_path / name, redis_server.url))  # noqa: E731
    a, b = Proxy(cfg("a"), embedder), Proxy(cfg("b"), embedder)
    try:
        first = a.chat("What is the capital of France?", temperature=0)
        assert first.headers["x-kvgate-cache"] == "miss"
        b.pipeline.index.catch_up(force=True)  # B's FAISS copy reads A's entry from the change log
        # B has no verified outcome for the route: explored (a miss with the fresh answer)
        explored = b.chat("Tell me the capital city of France", temperature=0)
        assert explored.headers["x-kvgate-cache"] == "miss"
        assert explored.json()["choices"][0]["message"]["content"] == PARIS
        b.pipeline.trust.drain()
        entry_id = a.pipeline.requests.get(first.headers["x-kvgate-request-id"]).entry_id
        # the verdict B recorded is A's to read: on Redis, under the shared entry id
        (seen,) = a.pipeline.trust.store.of_entry(entry_id)
        assert seen.correct and 0.6 < seen.similarity < 1.0
        assert a.pipeline.trust.store.count("chat") == 1
        # nothing under either proxy's cache_dir: the record is not per machine
        assert not (tmp_path / "a" / "observations").exists() and not (tmp_path / "b" / "observations").exists()

        # a verified history of the route, added through A (as other proxies would have left it):
        # candidates above cosine 0.8 were right every time; B serves from it
        for i in range(400):
            s = 0.6 + 0.4 * i / 400
            a.pipeline.trust.observe("chat", 10_000 + i, s, s > 0.8)
        judged_lookups(b.pipeline.trust)
        hit = b.chat("Which city is the capital of France?", temperature=0)
        assert hit.headers["x-kvgate-cache"] == "semantic", hit.headers
        assert hit.json()["choices"][0]["message"]["content"] == PARIS

        # Redis dies: a judged lookup costs a miss (the fresh answer), never an error
        redis_server.proc.kill()
        redis_server.proc.wait()
        down = b.chat("Which city is the capital of France?", temperature=0)
        assert down.status_code == 200 and down.headers["x-kvgate-cache"] == "miss"
        assert down.json()["choices"][0]["message"]["content"] == PARIS
    finally:
        a.stop()
        b.stop()
