"""The lean ASGI path of POST /v1/chat/completions (middleware/server/chat_asgi.py), on real uvicorn
servers over the fake backend: it skips FastAPI's middleware stack, and the FastAPI route, reached
when the app is mounted under a prefix, answers through the same handler."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.routing import Mount

from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import parse_config
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread
from tests.conftest import route_config


class Spy:
    """A middleware on FastAPI's stack: the paths it sees are the ones that went through it."""

    def __init__(self, app: Any, seen: list[str]) -> None:
        self.app, self.seen = app, seen

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.seen.append(scope["path"])
        await self.app(scope, receive, send)


def test_chat_skips_the_fastapi_stack_and_the_mounted_route_delegates(backend, embedder, tmp_path) -> None:
    raw = route_config(backend.api_base, tmp_path / "c")
    raw["auth"] = {"keys": ["k"]}
    config = parse_config(raw)
    pipeline = build_pipeline(config, embedder=embedder)
    app = create_app(config, pipeline)
    seen: list[str] = []
    app.add_middleware(Spy, seen=seen)
    server = ServerThread(app).start()
    mounted = ServerThread(Starlette(routes=[Mount("/gw", app=app)])).start()  # shares app.state
    key = {"authorization": "Bearer k"}
    body = {"model": "demo-1", "messages": [{"role": "user", "content": "lean path question"}]}
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.post("/v1/chat/completions", json=body).status_code == 401  # the key gate holds
            first = client.post("/v1/chat/completions", json=body, headers=key)
            assert first.status_code == 200 and first.headers["x-kvgate-cache"] == "miss"
            assert first.headers["content-type"] == "application/json"
            bad = client.post("/v1/chat/completions", content=b"{", headers=key)
            assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
            stream = client.post("/v1/chat/completions", json={**body, "stream": True}, headers=key)
            assert stream.status_code == 200 and stream.text.endswith("data: [DONE]\n\n")
            assert stream.headers["content-type"].startswith("text/event-stream")
            assert client.get("/v1/models", headers=key).status_code == 200
            assert "/v1/chat/completions" in client.get("/openapi.json", headers=key).json()["paths"]
        assert seen == ["/v1/models", "/openapi.json"]  # chat completions never went through FastAPI's stack
        with httpx.Client(base_url=mounted.url, timeout=30) as client:
            again = client.post("/gw/v1/chat/completions", json=body, headers=key)
            assert again.status_code == 200 and again.headers["x-kvgate-cache"] == "exact"
            assert again.json()["choices"][0]["message"]["content"] == first.json()["choices"][0]["message"]["content"]
            assert client.post("/gw/v1/chat/completions", json=body).status_code == 401
        assert "/gw/v1/chat/completions" in seen  # this one took the FastAPI route, to the same handler
    finally:
        mounted.stop()
        server.stop()
        pipeline.close()


class Sends:
    """Wraps the whole app and keeps the body messages each chat completion sent."""

    def __init__(self, app: Any) -> None:
        self.app, self.bodies = app, []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        mine: list[tuple[bytes, bool]] = []
        self.bodies.append(mine)

        async def keep(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                mine.append((message.get("body", b""), message.get("more_body", False)))
            await send(message)

        await self.app(scope, receive, keep)


def _served(api_base: str, tmp_path: Any, embedder: Any) -> tuple[Any, Sends, ServerThread]:
    """The test route's pipeline over `api_base`, served by uvicorn behind `Sends`."""
    config = parse_config(route_config(api_base, tmp_path / "c"))
    pipeline = build_pipeline(config, embedder=embedder)
    app = Sends(create_app(config, pipeline))
    return pipeline, app, ServerThread(app).start()


def test_a_stream_ends_with_its_done_event_in_one_send(backend, embedder, tmp_path) -> None:
    """[DONE] closes the body in the same message (one write), for a relayed miss and a stored hit;
    nothing is sent after it."""
    pipeline, app, server = _served(backend.api_base, tmp_path, embedder)
    body = {"model": "demo-1", "messages": [{"role": "user", "content": "one write at the end"}], "stream": True}
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            miss = client.post("/v1/chat/completions", json=body)
            hit = client.post("/v1/chat/completions", json=body)
        assert [miss.headers["x-kvgate-cache"], hit.headers["x-kvgate-cache"]] == ["miss", "exact"]
        for response, sent in zip((miss, hit), app.bodies):
            assert sent[-1] == (b"data: [DONE]\n\n", False)
            assert all(more for _, more in sent[:-1]) and len(sent) >= 2
            assert b"".join(chunk for chunk, _ in sent) == response.content
    finally:
        server.stop()
        pipeline.close()


async def _two_reads(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A replica whose stream comes in two reads: the first token, then the rest with its [DONE]."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    base = {"id": "chatcmpl-two", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def event(choice: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps({**base, "choices": [{"index": 0, **choice}]}).encode() + b"\n\n"

    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    first = event({"delta": {"role": "assistant", "content": "Hello"}})
    await send({"type": "http.response.body", "body": first, "more_body": True})
    await asyncio.sleep(0.2)
    rest = event({"delta": {"content": " world"}}) + event({"delta": {}, "finish_reason": "stop"})
    await send({"type": "http.response.body", "body": rest + b"data: [DONE]\n\n", "more_body": False})


def test_a_streams_last_read_goes_out_with_done_in_one_send(embedder, tmp_path) -> None:
    """The replica's last events, read with its own [DONE] after the first token went out, reach the
    client in the same message as kvgate's [DONE] (stored first: the repeat is a hit)."""
    replica = ServerThread(_two_reads).start()
    pipeline, app, server = _served(f"{replica.url}/v1", tmp_path, embedder)
    body = {"model": "demo-1", "messages": [{"role": "user", "content": "two reads"}], "stream": True}
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            miss = client.post("/v1/chat/completions", json=body)
            hit = client.post("/v1/chat/completions", json={**body, "stream": False})
        sent = app.bodies[0]
        assert len(sent) == 2 and sent[0][1] and not sent[1][1]
        assert sent[0][0].startswith(b"data: ") and b"Hello" in sent[0][0] and b"world" not in sent[0][0]
        last = sent[1][0]
        assert b"world" in last and b'"finish_reason": "stop"' in last and last.endswith(b"data: [DONE]\n\n")
        assert last.count(b"[DONE]") == 1 and miss.content == sent[0][0] + last
        assert hit.headers["x-kvgate-cache"] == "exact"
        assert hit.json()["choices"][0]["message"]["content"] == "Hello world"
    finally:
        server.stop()
        replica.stop()
        pipeline.close()
