"""The lean ASGI path of POST /v1/chat/completions, the proxy's hot route.

FastAPI serves every other route and documents this one in the OpenAPI schema; a chat completion
is answered here in plain ASGI: the same KeyGate (401) and AdmissionGate (429), the body read from
`receive`, the same parsing and checks, `Pipeline.acomplete`, the same headers and OpenAI error
JSON, and a streamed answer sent one `send` per replica read. It skips what a chat completion does
not use: Starlette's error, exception and routing middleware, the Request object, and
StreamingResponse's task group (instead, one task waits for the client to leave and cancels the
stream when it does). Each of those layers costs CPU on every relayed miss, and this route is
the one every request takes.

`ChatHandler` is the one implementation: the lean path calls it, and so does the FastAPI route
(reached only when the app is mounted inside another one), through `Delegate`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from kvgate.middleware.answers import openai_json
from kvgate.middleware.config import Config
from kvgate.middleware.errors import KvgateError
from kvgate.middleware.outcome import CacheInfo
from kvgate.middleware.pipeline import Pipeline, Result
from kvgate.middleware.request import CacheControl
from kvgate.middleware.server.auth import bearer_of, text_of_bearer
from kvgate.middleware.server.body import ClientGone, headers_of, read_declared
from kvgate.middleware.server.input_checks import check_token_caps
from kvgate.middleware.server.responses import error_response
from kvgate.middleware.server.timing import HEADER as TIMING_HEADER
from kvgate.middleware.server.timing import server_timing
from kvgate.middleware.tags import TAGS_HEADER, parse_tags
from kvgate.middleware.text_answers import DONE, Last

CONTROL_HEADER = b"x-kvgate-cache-control"
TAGS_BYTES = TAGS_HEADER.encode()
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
LEAN_PATHS = frozenset({CHAT_PATH, COMPLETIONS_PATH})

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


def cache_headers(info: CacheInfo) -> dict[str, str]:
    headers = {"x-kvgate-cache": info.cache, "x-kvgate-route": info.route}
    if info.similarity is not None:
        headers["x-kvgate-similarity"] = f"{info.similarity:.4f}"
    if info.replica is not None:
        headers["x-kvgate-replica"] = info.replica
    if info.expected_cached_tokens is not None:
        headers["x-kvgate-expected-cached-tokens"] = str(info.expected_cached_tokens)
    if info.cache != "miss" and info.entry_id is not None:  # a receipt: which entry served it, how old
        headers["x-kvgate-entry-id"] = str(info.entry_id)
        headers["x-kvgate-entry-age"] = f"{info.entry_age_s or 0.0:.3f}"
    if info.skipped is not None:
        headers["x-kvgate-cache-skipped"] = info.skipped
    headers["x-kvgate-request-id"] = info.request_id
    return headers


async def _sse(result: Result) -> AsyncIterator[bytes]:
    try:
        async for chunk in result.stream:
            payload = openai_json(chunk.model_dump(exclude_none=True))
            yield f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()
    except KvgateError as exc:  # the backend failed mid-stream: tell the client in-band
        yield exc.sse()
    yield DONE


class ChatHandler:
    """POST /v1/chat/completions as an ASGI app (behind the gates: the caller has a key)."""

    def __init__(
        self,
        app: FastAPI,
        config: Config,
        worker: int | None,
        tenant: Callable[[str | None], str],
        parse: Callable[[bytes], Awaitable[dict[str, Any]]],
    ) -> None:
        self.app = app
        self.config = config
        self.extra = [(b"x-kvgate-worker", str(worker).encode())] if worker is not None else []
        self._tenant = tenant
        self._parse = parse

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        started = [False]

        async def sending(message: dict[str, Any]) -> None:
            started[0] = True
            await send(message)

        try:
            await self._serve(scope, receive, sending)
        except ClientGone:
            return
        except Exception as exc:
            if started[0]:  # mid-stream: the connection is cut, as Starlette would
                raise
            await error_response(exc)(scope, receive, send)  # OpenAI error JSON; a 500 is logged there

    async def request(self, scope: Scope, receive: Any) -> tuple[str, dict[str, Any], CacheControl]:
        """(tenant, the parsed and checked body, the cache-control and tags headers' directives)."""
        headers = headers_of(scope)
        tenant = self._tenant(text_of_bearer(bearer_of(headers.get(b"authorization"))))
        limit = self.config.server.max_body_bytes
        body = await self._parse(await read_declared(receive, limit, headers.get(b"content-length")))
        check_token_caps(body, self.config.server)
        control_header = headers.get(CONTROL_HEADER)
        control = CacheControl.from_header(control_header.decode("latin-1") if control_header is not None else None)
        tags = headers.get(TAGS_BYTES)
        if tags is not None:  # checked before the request goes anywhere: a bad tag is a 400
            control = replace(control, tags=parse_tags(tags.decode("latin-1")))
        return tenant, body, control

    async def _serve(self, scope: Scope, receive: Any, send: Any) -> None:
        arrived = time.perf_counter()
        tenant, body, control = await self.request(scope, receive)
        pipeline: Pipeline = self.app.state.pipeline
        result = await pipeline.acomplete(body, tenant, control, raw=True)
        await self.respond(result, self.headers(result.info, arrived), scope, receive, send)

    def headers(self, info: CacheInfo, arrived: float) -> dict[str, str]:
        """One request's kvgate headers, and its Server-Timing when the config asks for it."""
        headers = cache_headers(info)
        if self.config.server.timing_header:
            headers[TIMING_HEADER] = server_timing(arrived, info.timing, time.perf_counter(), info.cache != "miss")
        return headers

    async def respond(self, result: Result, extra: dict[str, str], scope: Scope, receive: Any, send: Any) -> None:
        """Send a pipeline result: the replica's or the store's bytes as they are, else the JSON
        or SSE rendering of LiteLLM's objects; `extra`: the kvgate headers."""
        headers = list(zip(map(str.encode, extra), map(str.encode, extra.values()))) + self.extra
        if isinstance(result.raw, bytes):  # relayed from a replica as it answered (middleware/forward/relay.py)
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(result.raw)).encode())]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": result.raw, "more_body": False})
        elif result.raw is not None or result.stream is not None:
            headers += [(b"cache-control", b"no-cache"), (b"content-type", b"text/event-stream; charset=utf-8")]
            events = result.raw if result.raw is not None else _sse(result)
            await _stream(events, headers, receive, send)
        else:
            response = JSONResponse(openai_json(result.response.model_dump()))
            response.raw_headers += headers
            await response(scope, receive, send)


async def _stream(events: AsyncIterator[bytes], headers: list[tuple[bytes, bytes]], receive: Any, send: Any) -> None:
    """Send `events` as they come; the client leaving cancels the stream (closing it, so the
    pipeline's books balance) instead of relaying an answer nobody reads."""
    task = asyncio.current_task()
    assert task is not None
    gone = [False]

    def on_message(waiting: asyncio.Future[Any]) -> None:
        if not waiting.cancelled() and waiting.exception() is None and waiting.result()["type"] == "http.disconnect":
            gone[0] = True
            task.cancel()

    watch = asyncio.ensure_future(receive())
    watch.add_done_callback(on_message)
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        async for blob in events:
            if type(blob) is Last:  # always the last bytes ([DONE] at their end): they end the body in the same write
                await send({"type": "http.response.body", "body": blob, "more_body": False})
                return
            await send({"type": "http.response.body", "body": blob, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except asyncio.CancelledError:
        if not gone[0]:
            raise
        task.uncancel()
    finally:
        watch.remove_done_callback(on_message)
        watch.cancel()
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()


class Delegate(Response):
    """A FastAPI route's answer that hands the exchange to an ASGI app."""

    def __init__(self, target: ASGIApp) -> None:
        self.target = target
        self.background = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        await self.target(scope, receive, send)


class ByPath:
    """One ASGI app per lean path (behind one key gate and one admission gate). Matched on the
    path's end: mounted inside another app, the scope's path carries the mount's prefix."""

    def __init__(self, apps: dict[str, ASGIApp]) -> None:
        self.apps = apps

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        path = scope["path"]
        app = self.apps.get(path) or next(a for p, a in self.apps.items() if path.endswith(p))
        await app(scope, receive, send)


class LeanApp(FastAPI):
    """FastAPI whose POST /v1/chat/completions and /v1/completions bypass its middleware stack
    (`lean`, set by the proxy)."""

    lean: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if (
            self.lean is not None
            and scope["type"] == "http"
            and scope["path"] in LEAN_PATHS
            and scope["method"] == "POST"
        ):
            scope["app"] = self
            await self.lean(scope, receive, send)
            return
        await super().__call__(scope, receive, send)
