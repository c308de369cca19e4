"""The OpenAI wire format as the engines speak it: request validation, errors in OpenAI's JSON,
SSE framing, the replica-name header and KV-event publishing callbacks.

Shared by the simulator (kvgate.engines.sim), the reference replica (kvgate.engines.replica) and nothing of the
proxy: an engine process never imports `middleware` (see the import-linter contracts in
pyproject.toml), so this module has its own small error type instead of kvgate.middleware.errors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


class InvalidRequest(Exception):
    """A request an engine refuses: answered 400 with OpenAI's error JSON naming `param`."""

    status = 400

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_json(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": self.param, "code": None}}


def install_error_handler(app: FastAPI, on_error: Callable[[InvalidRequest], None] | None = None) -> None:
    """Answer InvalidRequest raised anywhere in `app` with a 400 in OpenAI's format; `on_error`
    sees each one first (a metrics counter)."""

    @app.exception_handler(InvalidRequest)
    async def _invalid(_: Request, exc: InvalidRequest) -> JSONResponse:
        if on_error is not None:
            on_error(exc)
        return JSONResponse(exc.to_json(), status_code=exc.status)


def read_json(raw: bytes) -> Any:
    """Decode a request body; InvalidRequest when it is not JSON."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None


@dataclass(frozen=True)
class ChatCall:
    """The fields of a chat request the simulation uses, validated."""

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int | None
    stream: bool
    include_usage: bool


def parse_chat(body: Any) -> ChatCall:
    """Validate a decoded request body; raises InvalidRequest naming the field."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise InvalidRequest("messages must be a non-empty list of objects", param="messages")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise InvalidRequest("max_tokens must be a positive integer", param="max_tokens")
    options = body.get("stream_options") or {}
    return ChatCall(
        model=str(body.get("model") or "sim"),
        messages=messages,
        max_tokens=max_tokens,
        stream=bool(body.get("stream")),
        include_usage=isinstance(options, dict) and bool(options.get("include_usage")),
    )


def sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class ReplicaHeader:
    """ASGI wrapper adding `header: NAME` to every HTTP response (streams included)."""

    def __init__(self, app: Any, name: str, header: bytes = b"x-sim-replica") -> None:
        self.app = app
        self.header = (header, name.encode())

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header)


def publisher_callbacks(publisher: Any, block_size: int, medium: str = "GPU") -> dict[str, Any]:
    """SimEngine keyword arguments (on_stored, on_removed, on_cleared) that publish each engine
    callback as one batch through an kvgate.index.kv.kv_events.ZmqEventPublisher-like `publish(events)`.
    Stored and removed events carry the same `medium` (the router's applier tracks blocks per
    medium): "GPU" (vLLM's own prefix cache) for the simulator, "CPU" for the reference replica's
    chunk store. A call may name another medium (the replica's "REMOTE" moves, engines/replica/announce.py)."""
    from kvgate.index.kv.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    def on_stored(hashes: list[int], token_ids: list[int], parent: int | None, where: str | None = None) -> None:
        publisher.publish(
            [
                BlockStored(
                    block_hashes=list(hashes),
                    parent_block_hash=parent,
                    token_ids=list(token_ids),
                    block_size=block_size,
                    medium=where or medium,
                )
            ]
        )

    def on_removed(hashes: list[int], where: str | None = None) -> None:
        publisher.publish([BlockRemoved(block_hashes=list(hashes), medium=where or medium)])

    def on_cleared() -> None:
        publisher.publish([AllBlocksCleared()])

    return {"on_stored": on_stored, "on_removed": on_removed, "on_cleared": on_cleared}
