"""A route's one backend (`backend.api_base`, no replicas) on the relay: the proxy passes the
backend's own bytes through as it does a replica's, asks it again `backend.num_retries` times after
a retryable failure (as LiteLLM did), and sends the key LiteLLM would have sent when the config
names none. Real sockets: the proxy and the backends are servers on loopback ports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from kvgate.engines.demo import Calls, create_fake_app
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import parse_config
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread


def _proxy(tmp: Path, url: str, forward: str = "relay", **backend: Any) -> tuple[Any, ServerThread]:
    config = parse_config(
        {
            "cache_dir": str(tmp / f"cache-{forward}"),
            "routes": [
                {
                    "name": "one",
                    "model": "fake*",
                    "semantic": {"enabled": False},
                    "backend": {"model": "openai/fake", "api_base": f"{url}/v1", "timeout": 10, **backend},
                    "routing": {"forward": forward},
                }
            ],
        }
    )
    pipeline = build_pipeline(config)
    return pipeline, ServerThread(create_app(config, pipeline)).start()


@pytest.fixture
def started() -> Iterator[list[Any]]:
    held: list[Any] = []
    yield held
    for item in reversed(held):
        if isinstance(item, ServerThread):
            item.stop()
        else:
            item.close()


def _chat(url: str, content: str, **params: Any) -> httpx.Response:
    body = {"model": "fake-1", "messages": [{"role": "user", "content": content}], **params}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)


def _content(resp: httpx.Response) -> str:
    """The answer's text, from a JSON body or from SSE deltas."""
    if not resp.headers["content-type"].startswith("text/event-stream"):
        return resp.json()["choices"][0]["message"]["content"]
    text = ""
    for line in resp.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or ""
    return text


def _recording_backend(headers: list[dict[str, str]], fail_first: int = 0) -> FastAPI:
    """The demo backend's answers, behind a front that keeps each request's headers and answers
    500 to the first `fail_first` requests."""
    inner = create_fake_app(Calls())
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        headers.append(dict(request.headers))
        if len(headers) <= fail_first:
            return JSONResponse({"error": {"message": "warming up", "type": "server_error"}}, 500)
        body = await request.body()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=inner), base_url="http://inner") as client:
            answer = await client.post(
                "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
            )
        return JSONResponse(answer.json())

    return app


@pytest.mark.parametrize("stream", [False, True])
def test_one_backend_is_relayed_with_the_answers_litellm_gives(started, tmp_path: Path, stream: bool) -> None:
    """Same answer as the LiteLLM path; the relay sends the backend no SDK headers and asks a
    stream's usage for the stored answer; the repeat is an exact hit on both."""
    calls = Calls()
    backend = ServerThread(create_fake_app(calls)).start()
    started.append(backend)
    texts = {}
    for forward in ("relay", "litellm"):
        pipeline, proxy = _proxy(tmp_path, backend.url, forward, api_key="sk-backend")
        started += [pipeline, proxy]
        miss = _chat(proxy.url, "[[fixed]] What is the capital of France?", stream=stream)
        hit = _chat(proxy.url, "[[fixed]] What is the capital of France?", stream=stream)
        assert miss.status_code == hit.status_code == 200, miss.text
        assert (miss.headers["x-kvgate-cache"], hit.headers["x-kvgate-cache"]) == ("miss", "exact")
        sent = calls.bodies[-1]
        assert sent["model"] == "fake"
        if forward == "relay" and stream:
            assert sent["stream_options"] == {"include_usage": True}
        texts[forward] = (_content(miss), _content(hit))
        if not stream:  # the hit is the answer the miss gave, field for field
            assert hit.json() == miss.json()
    assert texts["relay"] == texts["litellm"]
    assert texts["relay"][0] == texts["relay"][1] == "Answer: [[fixed]] What is the capital of France?"


@pytest.mark.parametrize("retries, status, asked", [(1, 200, 2), (0, 502, 1)])
def test_num_retries_asks_the_one_backend_again(started, tmp_path: Path, retries: int, status: int, asked: int) -> None:
    headers: list[dict[str, str]] = []
    backend = ServerThread(_recording_backend(headers, fail_first=1)).start()
    started.append(backend)
    pipeline, proxy = _proxy(tmp_path, backend.url, api_key="sk-backend", num_retries=retries)
    started += [pipeline, proxy]
    resp = _chat(proxy.url, "hello")
    assert resp.status_code == status, resp.text
    assert len(headers) == asked
    assert not any(name.startswith("x-stainless") for h in headers for name in h)  # not LiteLLM's client


def test_the_key_comes_from_the_providers_variable_when_the_config_names_none(
    started, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    headers: list[dict[str, str]] = []
    backend = ServerThread(_recording_backend(headers)).start()
    started.append(backend)
    pipeline, proxy = _proxy(tmp_path, backend.url)
    started += [pipeline, proxy]
    assert _chat(proxy.url, "hello").status_code == 200
    assert headers[-1]["authorization"] == "Bearer sk-from-env"


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_streamed_hit_is_the_stored_answer_in_chunks(started, tmp_path: Path, include_usage: bool) -> None:
    """A streamed exact hit: OpenAI chunks whose deltas join to the stored answer, the usage
    chunk only when asked for, no LiteLLM bookkeeping, [DONE] last."""
    backend = ServerThread(create_fake_app(Calls())).start()
    started.append(backend)
    pipeline, proxy = _proxy(tmp_path, backend.url, api_key="sk-backend")
    started += [pipeline, proxy]
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    question = "[[fixed]] Tell me about foxes, at some length please."
    miss = _chat(proxy.url, question, stream=True, **options)
    hit = _chat(proxy.url, question, stream=True, **options)
    assert (miss.headers["x-kvgate-cache"], hit.headers["x-kvgate-cache"]) == ("miss", "exact")
    assert hit.headers["content-type"].startswith("text/event-stream")
    lines = [line for line in hit.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert _content(hit) == _content(miss) == f"Answer: {question}"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert any("usage" in c for c in chunks) == include_usage
    assert "provider_specific_fields" not in hit.text
