"""A record step run in a worker thread (a long prompt or answer: kvgate.middleware.cache.offload)
writes in a batch of its own, as the event loop's group commit does for small ones: the entry's
rows and the request-log record each committed once, the batch's fate counted, never raised."""

from __future__ import annotations

import contextlib
import re
import sqlite3

import httpx

from kvgate.engines.demo import Calls, create_fake_app
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.cache.offload import INLINE_TOTAL_CHARS
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
    """Stored, counted, served again, and its request id judged: the record is in the log."""
    replica = ServerThread(create_fake_app(Calls())).start()
    config = one_replica_config(tmp_path / "cache", replica.url, routing={"prefix": {"tokenizer": "text"}})
    pipeline = build_pipeline(config, embedder=embedder)
    server = ServerThread(create_app(config, pipeline)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            first = _ask(client, LONG)
            assert first.headers["x-kvgate-cache"] == "miss"
            assert _stores(client, "stored") == 1 and _stores(client, "failed") == 0
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
