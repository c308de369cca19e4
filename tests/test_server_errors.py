"""The proxy's one body reader (middleware/server/body.py) and its one exception → OpenAI error JSON
mapper (middleware/server/responses.py), through the real app on a real server: every kind of
exception leaves with the right status, type and param, and every route that takes a body refuses
one past server.max_body_bytes."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import HTTPException

from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import parse_config
from kvgate.middleware.errors import BackendError, BadRequest, Conflict, KvgateError
from kvgate.middleware.outcome import CacheInfo, Result
from kvgate.middleware.server.body import ClientGone
from kvgate.middleware.server.proxy import create_app
from kvgate.middleware.server.responses import as_error, error_response
from kvgate.middleware.server.schema import FeedbackRequest
from kvgate.tools.bench.procs import ServerThread
from tests.conftest import route_config

KEY, ADMIN = "tenant-key", "admin-key"
LIMIT = 2000
ERROR_FIELDS = {"message", "type", "param", "code"}


class Server:
    def __init__(self, backend: Any, embedder: Any, tmp_path: Any) -> None:
        raw = route_config(backend.api_base, tmp_path / "cache")
        raw["auth"] = {"keys": [KEY], "admin_keys": [ADMIN]}
        raw["server"] = {"max_body_bytes": LIMIT}
        config = parse_config(raw)
        self.pipeline = build_pipeline(config, embedder=embedder)
        app = create_app(config, self.pipeline)

        # routes that raise each kind of exception the mapper knows, behind the real handlers
        @app.get("/test/pydantic")
        async def pydantic_error() -> None:
            FeedbackRequest.model_validate({"request_id": "x"})

        @app.get("/test/http")
        async def http_error() -> None:
            raise HTTPException(418, "short and stout", headers={"x-teapot": "yes"})

        @app.get("/test/kvgate")
        async def kvgate_error() -> None:
            raise Conflict("already there", param="name")

        @app.get("/test/boom")
        async def boom() -> None:
            raise RuntimeError("a bug")

        self.server = ServerThread(app).start()
        self.http = httpx.Client(base_url=self.server.url, timeout=30, headers={"authorization": f"Bearer {KEY}"})

    def close(self) -> None:
        self.http.close()
        self.server.stop()
        self.pipeline.close()


@pytest.fixture
def server(backend, embedder, tmp_path) -> Iterator[Server]:
    s = Server(backend, embedder, tmp_path)
    yield s
    s.close()


def error(resp: httpx.Response, status: int, type_: str = "invalid_request_error") -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == ERROR_FIELDS and err["type"] == type_ and err["message"], err
    return err


def chunked(body: bytes) -> Iterator[bytes]:  # no content-length: the reader counts as it reads
    for i in range(0, len(body), 512):
        yield body[i : i + 512]


BIG = json.dumps({"route": "chat", "name": "r9", "api_base": "http://127.0.0.1:9/v1", "pad": "x" * 3 * LIMIT}).encode()


def test_admin_refuses_a_body_over_max_body_bytes(server):
    admin = {"authorization": f"Bearer {ADMIN}", "content-type": "application/json"}
    for content in (BIG, chunked(BIG)):
        err = error(server.http.post("/v1/admin/replicas", content=content, headers=admin), 413)
        assert err["message"] == f"request body larger than server.max_body_bytes ({LIMIT} bytes)"
    assert (
        "not valid JSON"
        in error(server.http.post("/v1/admin/replicas", content=b"{nope", headers=admin), 400)["message"]
    )
    bad = error(server.http.post("/v1/admin/replicas", json={"route": "chat", "name": "r9"}, headers=admin), 400)
    assert bad["param"] == "api_base" and ": api_base: " in bad["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/cache/feedback"])
def test_every_body_route_refuses_past_the_limit(server, path):
    for content in (BIG, chunked(BIG)):
        err = error(server.http.post(path, content=content, headers={"content-type": "application/json"}), 413)
        assert "server.max_body_bytes" in err["message"]
    assert "not valid JSON" in error(server.http.post(path, content=b"{"), 400)["message"]
    assert error(server.http.post(path, content=b"[1]"), 400)["message"] == "request body must be a JSON object"


def test_each_kind_of_exception_maps_to_openai_error_json(server, caplog):
    http = server.http
    assert error(http.get("/test/kvgate"), 409) == Conflict("already there", param="name").to_json()["error"]
    pydantic = error(http.get("/test/pydantic"), 400)  # a pydantic ValidationError: 400 naming the field
    assert pydantic["param"] == "correct" and pydantic["message"].startswith("invalid request: correct: ")
    request = error(http.get("/v1/stats", params={"since": "soon"}), 400)  # FastAPI's RequestValidationError
    assert request["param"] == "query.since" and request["message"].startswith("invalid request: query.since: ")
    teapot = http.get("/test/http")  # Starlette's HTTPException: its status, and its headers kept
    assert error(teapot, 418)["message"] == "short and stout" and teapot.headers["x-teapot"] == "yes"
    assert error(http.get("/no/such/path"), 404)["message"] == "Not Found"
    wrong_method = http.delete("/v1/models")
    assert error(wrong_method, 405)["message"] == "Method Not Allowed" and "GET" in wrong_method.headers["allow"]
    unauthorised = http.get("/v1/models", headers={"authorization": "Bearer nope"})  # the key gate
    assert (
        error(unauthorised, 401)["code"] == "invalid_api_key" and unauthorised.headers["www-authenticate"] == "Bearer"
    )
    with caplog.at_level(logging.ERROR, logger="kvgate.proxy"):
        boom = error(http.get("/test/boom"), 500, "internal_error")
    assert boom["message"] == "internal error: RuntimeError"
    assert any(r.getMessage() == "unexpected error" and r.exc_info for r in caplog.records)


def test_the_lean_chat_path_maps_through_the_same_function(server, monkeypatch, caplog):
    body = {"model": "demo-1", "messages": [{"role": "user", "content": "a question"}]}

    async def refuse(*_: Any, **__: Any) -> Result:
        raise Conflict("no", param="model")

    monkeypatch.setattr(server.pipeline, "acomplete", refuse)
    assert error(server.http.post("/v1/chat/completions", json=body), 409)["param"] == "model"

    async def crash(*_: Any, **__: Any) -> Result:
        raise ZeroDivisionError("oops")

    monkeypatch.setattr(server.pipeline, "acomplete", crash)
    with caplog.at_level(logging.ERROR, logger="kvgate.proxy"):
        err = error(server.http.post("/v1/chat/completions", json=body), 500, "internal_error")
    assert err["message"] == "internal error: ZeroDivisionError"
    assert any(r.getMessage() == "unexpected error" for r in caplog.records)

    async def broken_stream() -> AsyncIterator[Any]:
        raise BackendError("backend error on route 'chat': gone", backend_status=None)
        yield  # pragma: no cover

    async def streaming(*_: Any, **__: Any) -> Result:
        return Result(CacheInfo(cache="miss", route="chat"), stream=broken_stream())

    monkeypatch.setattr(server.pipeline, "acomplete", streaming)
    streamed = server.http.post("/v1/chat/completions", json={**body, "stream": True})
    assert streamed.status_code == 200  # already answered: the error goes in-band
    event = BackendError("backend error on route 'chat': gone").sse()
    assert streamed.content == event + b"data: [DONE]\n\n"


def test_sse_event_is_the_error_json_on_one_line():
    err = BadRequest('naïve "quote"\nnext line', param="messages")
    event = err.sse()
    assert event.startswith(b"data: {") and event.endswith(b"\n\n") and event.count(b"\n") == 2
    assert json.loads(event[len(b"data: ") :]) == err.to_json()


def test_mapper_on_its_own():
    assert as_error(ClientGone()).status == 499  # the client left: no 500, nothing logged
    same = KvgateError("x")
    assert as_error(same) is same
    response = error_response(BadRequest("bad"), {"retry-after": "1"})
    assert response.status_code == 400 and response.headers["retry-after"] == "1"
    assert json.loads(response.body) == BadRequest("bad").to_json()
