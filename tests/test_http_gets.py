"""PooledGets: the proxy's background GETs on the relay's pool, answering and failing as httpx does
for its callers (the engine adapters, the health loop, the replicas' /metrics reader)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from kvgate.middleware.engines.discover import discover
from kvgate.middleware.forward.http_gets import PooledGets
from kvgate.middleware.telemetry.replica_scrape import fetch_texts
from kvgate.tools.bench.procs import ServerThread

PAGE = (Path(__file__).parent / "data" / "vllm-0.32-metrics.txt").read_text()


def _app() -> FastAPI:
    app = FastAPI()
    seen: list[str | None] = []
    app.state.seen = seen

    @app.get("/metrics")
    def metrics(request: Request) -> PlainTextResponse:
        seen.append(request.headers.get("accept-encoding"))
        return PlainTextResponse(PAGE)

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": "m", "root": "/models/m", "max_model_len": 2048}]}

    @app.get("/slow")
    async def slow() -> dict:
        await asyncio.sleep(2)
        return {}

    return app


@pytest.fixture(scope="module")
def server():
    app = _app()
    srv = ServerThread(app).start()
    try:
        yield srv, app
    finally:
        srv.stop()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gets_read_what_httpx_reads(server):
    srv, app = server

    async def main():
        async with PooledGets() as gets, httpx.AsyncClient() as client:
            ours = await gets.get(f"{srv.url}/metrics")
            theirs = await client.get(f"{srv.url}/metrics")
            assert (ours.status_code, ours.text) == (theirs.status_code, theirs.text)
            assert (await gets.get(f"{srv.url}/v1/models")).json() == (await client.get(f"{srv.url}/v1/models")).json()
            missing = await gets.get(f"{srv.url}/nowhere")
            assert missing.status_code == 404
            with pytest.raises(ValueError):
                (await gets.get(f"{srv.url}/metrics")).json()
            texts = await fetch_texts(gets, {"a": f"{srv.url}/metrics", "b": f"{srv.url}/nowhere"})
            assert texts == {"a": PAGE, "b": None}
            info = await discover(gets, f"{srv.url}/v1")  # the engine adapters read through it too
            assert info is not None

    asyncio.run(main())
    assert app.state.seen[0] == "identity"  # the page is not compressed for us


def test_failures_are_httpxs(server):
    srv, _ = server

    async def main():
        async with PooledGets() as gets:
            with pytest.raises(httpx.ConnectError):  # nothing listens: "no engine there"
                await gets.get(f"http://127.0.0.1:{_closed_port()}/v1/models")
            with pytest.raises(httpx.TimeoutException):
                await gets.get(f"{srv.url}/slow", timeout=0.2)
            ok = await gets.get(f"{srv.url}/v1/models")  # the pool goes on after both
            assert ok.status_code == 200

    asyncio.run(main())
