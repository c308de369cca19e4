"""Where a request's cache writes are committed: a record step run in a worker thread (a long
prompt or answer: kvgate.middleware.cache.offload) in a batch of its own, as the event loop's group
commit does for small ones (the entry's rows and the request-log record one transaction per
store, the batch's fate counted, never raised); a hit answered on the loop logs its request id in
the loop's group commit, with the inline record steps of its turn."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3

import httpx

from kvgate.engines.demo import Calls, create_fake_app
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.cache.offload import INLINE_TOTAL_CHARS
from kvgate.middleware.cache.request_log import DiskRequestLog
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread
from tests.conftest import one_replica_config

LONG = "a prompt past the total bound " + "y" * INLINE_TOTAL_CHARS  # its cache steps hop to a worker thread


def _stores(client: httpx.Client, result: str) -> float:
    found = re.search(
        rf'kvgate_cache_stores_total\{{[^}}]*result="{result}"[^}}]*\}} ([0-9.e+]+)', client.get("/metrics").text
    )
    return float(found.group(1)) if found else 0.0


def _ask(client: httpx.Client, content: str) -> httpx.Response:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": content}]}
    resp = client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    return resp


def test_an_offloaded_record_stores_the_answer_and_its_request_record(embedder, tmp_path):
    """Stored, counted, served again, and its request id judged: the record is committed (another
    handle on the log's directory reads it)."""
    replica = ServerThread(create_fake_app(Calls())).start()
    config = one_replica_config(tmp_path / "cache", replica.url, routing={"prefix": {"tokenizer": "text"}})
    pipeline = build_pipeline(config, embedder=embedder)
    server = ServerThread(create_app(config, pipeline)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            first = _ask(client, LONG)
            assert first.headers["x-kvgate-cache"] == "miss"
            assert _stores(client, "stored") == 1 and _stores(client, "failed") == 0
            other = DiskRequestLog(config.cache_dir / "requests", ttl=60, max_bytes=2**20)  # another process's view
            try:
                record = other.get(first.headers["x-kvgate-request-id"])
                assert record is not None and record.tier == "miss" and record.entry_id is not None
            finally:
                other.close()
            assert _ask(client, LONG).headers["x-kvgate-cache"] == "exact"
            verdict = client.post(
                "/v1/cache/feedback", json={"request_id": first.headers["x-kvgate-request-id"], "correct": False}
            )
            assert verdict.status_code == 200 and verdict.json()["removed"] is True, verdict.text
            assert _ask(client, LONG).headers["x-kvgate-cache"] == "miss"  # the judged answer is gone
    finally:
        server.stop()
        pipeline.close()
        replica.stop()


def test_an_offloaded_record_whose_commit_fails_counts_a_failed_store(embedder, tmp_path):
    """The entry store's transaction fails at its end: the client still has its answer, the store
    is counted failed (not stored), and nothing of it is served afterwards."""
    replica = ServerThread(create_fake_app(Calls())).start()
    config = one_replica_config(tmp_path / "cache", replica.url, routing={"prefix": {"tokenizer": "text"}})
    pipeline = build_pipeline(config, embedder=embedder)
    entries = pipeline.cache.index.entries
    real = entries.batch

    @contextlib.contextmanager
    def failing():  # the body's writes rolled back, then the commit reported failed
        with contextlib.suppress(LookupError):
            with real():
                yield
                raise LookupError("roll back")
        raise sqlite3.OperationalError("disk I/O error")

    entries.batch = failing  # type: ignore[method-assign]
    server = ServerThread(create_app(config, pipeline)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert _ask(client, LONG).headers["x-kvgate-cache"] == "miss"
            assert _stores(client, "failed") == 1 and _stores(client, "stored") == 0
            entries.batch = real  # type: ignore[method-assign]
            assert _ask(client, LONG).headers["x-kvgate-cache"] == "miss"  # the lost write left nothing
            assert _stores(client, "stored") == 1
    finally:
        server.stop()
        pipeline.close()
        replica.stop()


def test_inline_hits_log_their_request_ids_in_the_loops_group_commit(embedder, tmp_path):
    """Concurrent small hits: each one's record is a step of the log's group commit, written before
    its answer goes out, so every hit's request id can be judged at once."""
    replica = ServerThread(create_fake_app(Calls())).start()
    config = one_replica_config(tmp_path / "cache", replica.url, routing={"prefix": {"tokenizer": "text"}})
    pipeline = build_pipeline(config, embedder=embedder)
    server = ServerThread(create_app(config, pipeline)).start()
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "a small question?"}]}

    async def hits(n: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            return await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(n)))

    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert _ask(client, body["messages"][0]["content"]).headers["x-kvgate-cache"] == "miss"
            steps = pipeline.cache.log_commits.steps
            answers = asyncio.run(hits(8))
            assert [r.headers["x-kvgate-cache"] for r in answers] == ["exact"] * 8
            assert pipeline.cache.log_commits.steps == steps + 8
            for resp in answers:
                verdict = client.post(
                    "/v1/cache/feedback", json={"request_id": resp.headers["x-kvgate-request-id"], "correct": True}
                )
                assert verdict.status_code == 200 and verdict.json()["tier"] == "exact", verdict.text
    finally:
        server.stop()
        pipeline.close()
        replica.stop()
