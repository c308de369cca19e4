"""Scale-out on Redis end to end: two real proxies (uvicorn + Pipeline + real LiteLLM + real
embedder) on one real redis-server, the fake backend behind both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import parse_config
from kvgate.middleware.errors import ConfigError
from kvgate.middleware.pipeline import Pipeline
from kvgate.tools.redis_proc import RedisServer
from tests.conftest import route_config

QUESTION = "What is the capital of France?"
PARAPHRASE = "Tell me the capital city of France"


def redis_config(api_base: str, cache_dir: Path, url: str, **store: Any) -> dict[str, Any]:
    raw = route_config(api_base, cache_dir)
    raw["store"] = {"backend": "redis", "url": url, "follow_interval_s": 0.1, **store}
    return raw


def answer(resp) -> str:
    return resp.json()["choices"][0]["message"]["content"]


def test_two_proxies_share_one_cache(make_proxy, backend, redis_server: RedisServer, tmp_path: Path) -> None:
    a = make_proxy(raw=redis_config(backend.api_base, tmp_path / "a", redis_server.url))
    b = make_proxy(raw=redis_config(backend.api_base, tmp_path / "b", redis_server.url))
    stored = a.chat(QUESTION)
    assert stored.headers["x-kvgate-cache"] == "miss"
    calls = backend.count

    exact = b.chat(QUESTION)
    assert exact.headers["x-kvgate-cache"] == "exact" and answer(exact) == answer(stored)
    b.pipeline.index.catch_up(force=True)  # B reads A's add from the stream into its FAISS copy
    semantic = b.chat(PARAPHRASE)
    assert semantic.headers["x-kvgate-cache"] == "semantic" and answer(semantic) == answer(stored)
    assert backend.count == calls

    # another tenant sees nothing of key-a's entries, on either proxy
    other = b.chat(QUESTION, key="key-b")
    assert other.headers["x-kvgate-cache"] == "miss" and answer(other) != answer(stored)
    assert a.chat(PARAPHRASE, key="key-b").headers["x-kvgate-cache"] in ("miss", "semantic")
    assert answer(a.chat(PARAPHRASE, key="key-b")) != answer(stored)

    # feedback given to B on the request A served deletes the entry for everyone
    entry_id = a.pipeline.requests.get(stored.headers["x-kvgate-request-id"]).entry_id
    assert entry_id in a.pipeline.index.eviction and entry_id in b.pipeline.index.eviction
    verdict = b.http.post(
        "/v1/cache/feedback",
        json={"request_id": stored.headers["x-kvgate-request-id"], "correct": False},
        headers={"authorization": "Bearer key-a"},
    )
    assert verdict.status_code == 200 and verdict.json()["removed"] is True
    assert a.chat(QUESTION, headers={"x-kvgate-cache-control": "no-store"}).headers["x-kvgate-cache"] == "miss"
    a.pipeline.index.catch_up(force=True)  # A reads B's delete: its local traces are gone too
    assert entry_id not in a.pipeline.index.eviction and entry_id not in b.pipeline.index.eviction
    assert b.chat(PARAPHRASE, headers={"x-kvgate-cache-control": "no-store"}).headers["x-kvgate-cache"] == "miss"
    metrics = a.http.get("/metrics").text
    assert "kvgate_store_up 1.0" in metrics and "kvgate_store_follow_lag_seconds" in metrics


def ask(pipeline: Pipeline, question: str, tenant: str = "t1") -> tuple[str, str]:
    """(cache tier, answer text) of one chat through a pipeline; any exception fails the test."""
    result = pipeline.complete({"model": "demo-1", "messages": [{"role": "user", "content": question}]}, tenant)
    return result.info.cache, result.response.choices[0].message.content


def test_redis_out_of_reach_at_start_up(backend, tmp_path: Path, monkeypatch) -> None:
    down = RedisServer()  # a free port nobody listens on
    monkeypatch.setenv("KVGATE_TEST_REDIS_PW", "s3cret")
    raw = redis_config(
        backend.api_base, tmp_path, f"redis://admin@127.0.0.1:{down.port}/0", password_env="KVGATE_TEST_REDIS_PW"
    )
    with pytest.raises(ConfigError) as err:
        build_pipeline(parse_config(raw))
    message = err.value.message
    assert message.startswith("store.url: Redis at redis://127.0.0.1:") and "\n" not in message
    assert "s3cret" not in message and "admin" not in message
    raw["store"]["password_env"] = "KVGATE_TEST_NOT_SET"
    with pytest.raises(ConfigError, match="store.password_env: the environment variable KVGATE_TEST_NOT_SET"):
        build_pipeline(parse_config(raw))
    with pytest.raises(ConfigError, match="store.password: a password is never read"):
        parse_config({**raw, "store": {"backend": "redis", "url": "redis://127.0.0.1", "password": "x"}})


def test_degrade_starts_without_redis_and_recovers(backend, embedder, tmp_path: Path) -> None:
    server = RedisServer()  # not started yet
    pipeline = build_pipeline(
        parse_config(redis_config(backend.api_base, tmp_path, server.url, on_error="degrade")), embedder=embedder
    )
    try:
        assert ask(pipeline, "degraded question one")[0] == "miss"
        assert ask(pipeline, "degraded question one")[0] == "miss"  # nothing could be stored
        assert pipeline.index.stats()["storage_errors"] > 0
        server.start()
        for _ in range(100):  # the link retries after its backoff; then the answer is stored
            if ask(pipeline, "degraded question two")[0] == "exact":
                break
        assert ask(pipeline, "degraded question two")[0] == "exact"
    finally:
        pipeline.close()
        server.stop()


def test_redis_killed_then_restarted_empty(backend, embedder, redis_server: RedisServer, tmp_path: Path) -> None:
    """SIGKILL mid-run: misses, never errors; restarted empty: misses, never a stale or wrong answer."""
    a = build_pipeline(
        parse_config(redis_config(backend.api_base, tmp_path / "a", redis_server.url)), embedder=embedder
    )
    b = build_pipeline(
        parse_config(redis_config(backend.api_base, tmp_path / "b", redis_server.url)), embedder=embedder
    )
    try:
        tier, first = ask(a, QUESTION)
        assert tier == "miss" and ask(b, QUESTION) == ("exact", first)
        b.index.catch_up(force=True)
        assert ask(b, PARAPHRASE) == ("semantic", first)

        redis_server.proc.kill()  # a crash: connections refused from now on
        redis_server.proc.wait()
        for pipeline in (a, b):
            for question in (QUESTION, PARAPHRASE, "a question asked during the outage"):
                tier, text = ask(pipeline, question)
                assert tier == "miss" and text.endswith(question)
        assert b"kvgate_store_up 0.0" in a.metrics.render()
        assert b'kvgate_store_errors_total{op="lookup"}' in a.metrics.render()

        redis_server.restart()  # empty: every entry is gone
        served: list[tuple[str, str]] = []
        for _ in range(60):  # until the links close again (backoff) and a new answer is served from Redis
            served += [ask(a, PARAPHRASE), ask(b, QUESTION)]
            if (
                served[-2][0] != "miss" and served[-1][0] != "miss"
            ):  # both links closed (each backs off on its own clock)
                break
        # never the answer from before the crash, and every answer is to the question asked
        assert all(text != first for _, text in served)
        assert all(text.endswith((PARAPHRASE, QUESTION)) for _, text in served)
        assert served[-2][0] != "miss" and served[-1][0] != "miss" and b"kvgate_store_up 1.0" in a.metrics.render()
        a.index.catch_up(force=True)  # the log was reset: A rebuilt its view from Redis
        assert a.index._follow is not None and a.index._follow.gaps >= 1
    finally:
        a.close()
        b.close()


def test_password_comes_from_the_named_variable(backend, embedder, tmp_path: Path, monkeypatch) -> None:
    with RedisServer(password="s3cret-pw") as server:
        raw = redis_config(backend.api_base, tmp_path, server.url)
        with pytest.raises(ConfigError, match="store.url: Redis at redis://127.0.0.1:") as err:
            build_pipeline(parse_config(raw), embedder=embedder)  # no password: refused by Redis
        assert "s3cret" not in err.value.message
        monkeypatch.setenv("KVGATE_TEST_REDIS_PW", "s3cret-pw")
        raw["store"]["password_env"] = "KVGATE_TEST_REDIS_PW"
        pipeline = build_pipeline(parse_config(raw), embedder=embedder)
        try:
            assert ask(pipeline, "a question behind a password")[0] == "miss"
            assert ask(pipeline, "a question behind a password")[0] == "exact"
        finally:
            pipeline.close()


def test_link_backs_off_after_a_failure_and_closes_on_success() -> None:
    import redis as redis_py

    from kvgate.index.storage.redis_link import LinkSettings, RedisLink, StoreDown, redacted

    now = [100.0]  # the link's clock: it moves only when the test moves it
    server = RedisServer()  # its port, nobody listening yet
    link = RedisLink(LinkSettings(server.url, backoff_min_s=0.2, backoff_max_s=0.4), clock=lambda: now[0])
    with pytest.raises(redis_py.exceptions.ConnectionError) as first:
        link.ping()
    assert not isinstance(first.value, StoreDown) and not link.up
    server.start()  # listening now, but the link is backing off
    try:
        now[0] += 0.19
        with pytest.raises(StoreDown):  # refused without a round trip: a try would have worked
            link.ping()
        assert link.errors["ping"] == 2 and not link.up
        now[0] += 0.02
        link.ping()  # the backoff is over: one try, it works, the link closes
        assert link.up and link.run("get", lambda r: r.get("x")) is None
    finally:
        link.close()
        server.stop()
    assert redacted("redis://user:pw@10.0.0.5:6380/2") == "redis://10.0.0.5:6380/2"


def test_feedback_off_writes_no_request_ids_to_redis(
    backend, embedder, redis_server: RedisServer, tmp_path: Path
) -> None:
    """With `feedback.enabled: false` on the Redis store the answer is shared as before, and no key
    of the request log is made (with it on, the same requests make them: the check can fail)."""
    import redis as redis_client

    made = {}
    for enabled in (True, False):
        prefix = f"kvg{int(enabled)}:"
        raw = redis_config(backend.api_base, tmp_path / prefix, redis_server.url, key_prefix=prefix)
        raw["feedback"] = {"enabled": enabled}
        pipeline = build_pipeline(parse_config(raw), embedder=embedder)
        try:
            assert ask(pipeline, QUESTION)[0] == "miss" and ask(pipeline, QUESTION)[0] == "exact"
        finally:
            pipeline.close()
        keys = redis_client.Redis.from_url(redis_server.url).keys(f"{prefix}*")
        made[enabled] = [k for k in keys if k.startswith(f"{prefix}r:kvg-".encode())]
        assert len(keys) > len(made[enabled])  # the entries themselves are there either way
    assert len(made[True]) == 2 and made[False] == []
