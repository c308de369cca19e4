"""The relay (middleware/forward/relay.py): proxy misses on OpenAI-compatible replicas pass through as the
replica's bytes. Same answers as the LiteLLM path, the same failover and resume rules, and the
SSE parser's framing on its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import orjson
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.engines.demo import Calls, create_fake_app
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import parse_config
from kvgate.middleware.errors import ConfigError
from kvgate.middleware.forward.relay import wire_model
from kvgate.middleware.forward.relay_events import ReplicaError, SseParser
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread


def _config(tmp: Path, urls: list[str], forward: str, **routing: Any) -> Any:
    return parse_config(
        {
            "cache_dir": str(tmp / f"cache-{forward}"),
            "routes": [
                {
                    "name": "local",
                    "model": "fake*",
                    "semantic": {"enabled": False},
                    "backend": {"model": "openai/fake", "api_key": "none", "timeout": 10},
                    "replicas": [{"name": f"r{i}", "api_base": f"{u}/v1"} for i, u in enumerate(urls)],
                    "routing": {
                        "policy": "round_robin",
                        "tokenizer": "text",
                        "forward": forward,
                        "probe_interval_s": 60,
                        **routing,
                    },
                }
            ],
        }
    )


class Proxy:
    def __init__(self, tmp: Path, urls: list[str], forward: str, **routing: Any) -> None:
        self.pipeline = build_pipeline(_config(tmp, urls, forward, **routing))
        self.server = ServerThread(create_app(self.pipeline.config, self.pipeline)).start()
        self.http = httpx.Client(base_url=self.server.url, timeout=30)

    def chat(self, content: str, **params: Any) -> httpx.Response:
        return self.http.post(
            "/v1/chat/completions",
            json={"model": "fake-1", "messages": [{"role": "user", "content": content}], **params},
        )

    def stop(self) -> None:
        self.http.close()
        self.server.stop()
        self.pipeline.close()


@pytest.fixture
def servers() -> Iterator[Any]:
    started: list[Any] = []

    def start(app: Any) -> ServerThread:
        started.append(ServerThread(app).start())
        return started[-1]

    def proxy(tmp: Path, urls: list[str], forward: str, **routing: Any) -> Proxy:
        started.append(Proxy(tmp, urls, forward, **routing))
        return started[-1]

    yield start, proxy
    for s in reversed(started):
        s.stop()


def _events(resp: httpx.Response) -> list[Any]:
    return [
        json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
        for line in resp.text.splitlines()
        if line.startswith("data: ")
    ]


def _text(resp: httpx.Response) -> tuple[str, str | None, Any]:
    """(content, finish reason, usage) of a JSON or SSE answer."""
    if not resp.headers["content-type"].startswith("text/event-stream"):
        choice = resp.json()["choices"][0]
        return choice["message"]["content"], choice["finish_reason"], resp.json().get("usage")
    text, finish, usage = "", None, None
    for event in _events(resp):
        if event == "[DONE]":
            continue
        assert "error" not in event, event
        usage = event.get("usage") or usage
        for choice in event.get("choices") or []:
            text += (choice.get("delta") or {}).get("content") or ""
            finish = choice.get("finish_reason") or finish
    return text, finish, usage


CASES = [
    ("[[fixed]] What is the capital of France?", {"temperature": 0}),
    ("[[fixed]] Stream me a story about a fox.", {"stream": True}),
    ("[[fixed]] Stream me the usage too.", {"stream": True, "stream_options": {"include_usage": True}}),
    ("[[fixed]] [[length]] An answer cut short.", {"stream": True}),
]


def test_relay_answers_as_litellm_does(servers, tmp_path: Path) -> None:
    """Same content, finish reason and headers through both forwarding paths, for the miss and for
    the hit it stored; usage only where the client asked for it; an answer cut short not stored."""
    start, proxy = servers
    replica = start(create_fake_app(Calls()))
    relay, litellm = proxy(tmp_path, [replica.url], "relay"), proxy(tmp_path, [replica.url], "litellm")
    for question, params in CASES:
        got = {}
        for name, p in (("relay", relay), ("litellm", litellm)):
            miss, hit = p.chat(question, **params), p.chat(question, **params)
            assert miss.status_code == 200 and hit.status_code == 200, (miss.text, hit.text)
            assert miss.headers["x-kvgate-cache"] == "miss" and miss.headers["x-kvgate-replica"] == "r0"
            assert miss.headers["x-kvgate-request-id"].startswith("kvg-")
            if params.get("stream"):
                assert miss.text.rstrip().endswith("data: [DONE]") and miss.headers["cache-control"] == "no-cache"
            cut = "[[length]]" in question
            assert hit.headers["x-kvgate-cache"] == ("miss" if cut else "exact")
            got[name] = (_text(miss), _text(hit))
        (relay_miss, relay_hit), (litellm_miss, litellm_hit) = got["relay"], got["litellm"]
        assert relay_miss[:2] == litellm_miss[:2] == relay_hit[:2] == litellm_hit[:2]
        wants_usage = bool(params.get("stream_options")) or not params.get("stream")
        assert (relay_miss[2] is not None) == wants_usage, relay_miss
    # the relay asked for the usage of every stream, so stored streamed answers carry real counts
    stored = relay.pipeline.index.get_exact(
        relay.pipeline.view(
            {"model": "fake-1", "messages": [{"role": "user", "content": CASES[1][0]}], "stream": True}
        ).exact_key
    )
    assert stored is not None and stored.response["usage"]["completion_tokens"] > 0


def test_relay_sends_openai_fields_only(servers, tmp_path: Path) -> None:
    start, proxy = servers
    calls = Calls()
    replica = start(create_fake_app(calls))
    p = proxy(tmp_path, [replica.url], "relay")
    resp = p.chat("hello", temperature=0.5, user="u1", metadata={"team": "a"}, stream=True)
    assert resp.status_code == 200
    sent = calls.bodies[-1]
    assert sent["model"] == "fake" and sent["temperature"] == 0.5 and sent["user"] == "u1"
    assert sent["stream_options"] == {"include_usage": True} and "metadata" not in sent


def test_caller_errors_pass_through_and_server_errors_fail_over(servers, tmp_path: Path) -> None:
    """A replica's 400 is the caller's: returned with its status and message, no other replica
    tried. A 500 marks the replica down and the next one answers."""
    start, proxy = servers
    refusing = FastAPI()

    @refusing.post("/v1/chat/completions")
    async def refuse() -> JSONResponse:
        return JSONResponse({"error": {"message": "max_tokens is too large", "type": "invalid_request_error"}}, 400)

    bad = start(refusing)
    p = proxy(tmp_path, [bad.url], "relay")
    resp = p.chat("too long", max_tokens=5)
    assert resp.status_code == 400 and "max_tokens is too large" in resp.json()["error"]["message"]
    calls = [Calls(), Calls()]
    failing, healthy = start(create_fake_app(calls[0])), start(create_fake_app(calls[1]))
    q = proxy(tmp_path / "b", [failing.url, healthy.url], "relay")
    # [[fail]] makes every fake replica answer 500: both are tried, the client gets a 502
    resp = q.chat("[[fail]] boom", stream=True)
    assert resp.status_code == 502 and resp.json()["error"]["type"] == "backend_error"
    assert calls[0].count == calls[1].count == 1


@pytest.mark.parametrize("forward", ["relay", "litellm"])
def test_greedy_stream_resumes_on_both_paths(servers, tmp_path: Path, forward: str) -> None:
    start, proxy = servers
    calls = [Calls(), Calls()]
    broken = start(create_fake_app(calls[0], break_streams_after=3))
    healthy = start(create_fake_app(calls[1]))
    p = proxy(tmp_path, [broken.url, healthy.url], forward, down_for_s=30)
    question = "[[fixed]] Tell me a long story about a fox who lived under a bridge"
    resp = p.chat(question, stream=True, temperature=0)
    text, finish, _ = _text(resp)
    assert text == f"Answer: {question}" and finish == "stop"
    ids = {e["id"] for e in _events(resp) if e != "[DONE]"}
    assert len(ids) == 1  # one id per client stream, whichever replica wrote the chunk
    assert calls[0].count == 1 and calls[1].count == 1
    assert all(r["in_flight"] == 0 for r in p.pipeline.routers["local"].stats().values())


# ---------------------------------------------------------------- the parser alone
def _chunk(
    content: str | None = None, finish: str | None = None, role: str | None = None, **extra: Any
) -> dict[str, Any]:
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


def _sse(events: list[Any], sep: bytes = b"\n\n") -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + sep for e in events)


@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n"])
def test_parser_framing_any_split(sep: bytes) -> None:
    """Events cut anywhere by the network come out whole and unchanged; [DONE] is held back."""
    events = [_chunk("", role="assistant"), _chunk("Hello "), _chunk("world"), _chunk(finish="stop")]
    wire = b": keep-alive" + sep + _sse(events, sep) + b"data: [DONE]" + sep
    parser = SseParser(False)
    sent, seen = [], []
    for i in range(len(wire)):
        sent.append(parser.feed(wire[i : i + 1]))
        seen.append(parser.first_seen)
    assert b"".join(sent) == b": keep-alive" + sep + _sse(events, sep)
    # the first content token is seen with the event that carries it (not the role-only one before)
    assert b"".join(sent[: seen.index(True) + 1]).endswith(_sse(events[1:2], sep))
    assert parser.resume.sent_text == "Hello world" and parser.finish == "stop"
    assert parser.answer([])["choices"][0]["message"] == {"role": "assistant", "content": "Hello world"}


_USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
# (the event as the replica writes it, before its separator; what the client gets for it when the
# parser strips usage, and when it does not; None: nothing)
_EVENTS: list[tuple[bytes, Any, Any]] = [
    (b"data: " + json.dumps(_chunk("Hi")).encode(), "same", "same"),
    (b"data:" + json.dumps(_chunk(" there")).encode(), "same", "same"),  # no space after the colon
    (b": keep-alive", "same", "same"),
    (b"event: note\ndata: " + json.dumps(_chunk("!")).encode(), "same", "same"),  # two lines
    (b"data: " + json.dumps({"id": "c1", "choices": [], "usage": _USAGE}).encode(), None, "same"),
    (
        b"data: " + json.dumps(_chunk(finish="stop", usage=_USAGE)).encode(),
        b"data: " + orjson.dumps(_chunk(finish="stop")),
        "same",
    ),
    (b"data: [DONE]", None, None),
]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, len(_EVENTS) - 1), min_size=1, max_size=12),
    st.sets(st.integers(1, 4000), max_size=12),
    st.booleans(),
    st.sampled_from([b"\n\n", b"\r\n\r\n"]),
)
def test_parser_passes_each_event_on_as_it_came_unless_it_must_change(
    picks: list[int], cuts: set[int], strip: bool, sep: bytes
) -> None:
    """Whatever the mix of events and wherever the network cuts them, the client gets each event's
    own bytes in order, except [DONE] (held back) and usage it did not ask for (dropped, or the
    chunk rewritten without it)."""
    if sep == b"\r\n\r\n":
        picks = [p for p in picks if b"\n" not in _EVENTS[p][0]]  # its lines would be split by CRLF
    wire = b"".join(_EVENTS[p][0] + sep for p in picks)
    expected = b""
    for p in picks:
        event, stripped, kept = _EVENTS[p]
        out = stripped if strip else kept
        expected += event + sep if out == "same" else (out + sep if out is not None else b"")
    parser = SseParser(strip)
    bounds = [0, *sorted(c for c in cuts if c < len(wire)), len(wire)]
    sent = b"".join(parser.feed(wire[a:b]) for a, b in zip(bounds, bounds[1:]))
    assert sent == expected


def test_parser_strips_the_usage_it_asked_for() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    events = [_chunk("Hi"), _chunk(finish="stop"), {"id": "c1", "choices": [], "usage": usage}]
    parser = SseParser(True)
    assert parser.feed(_sse(events)) == _sse(events[:2])
    assert parser.answer([])["usage"] == usage
    on_finish = SseParser(True)  # a server that puts usage on the finishing chunk
    out = on_finish.feed(_sse([_chunk("Hi"), _chunk(finish="stop", usage=usage)]))
    assert b"usage" not in out and on_finish.usage == usage


def test_parser_errors_and_resume() -> None:
    with pytest.raises(ReplicaError, match="overloaded"):
        SseParser(False).feed(_sse([_chunk("a"), {"error": {"message": "overloaded", "code": 503}}]))
    with pytest.raises(ReplicaError):
        SseParser(False).feed(b"data: {not json\n\n")
    parser = SseParser(False)
    parser.feed(_sse([_chunk("", role="assistant"), _chunk("Hello ")]))
    parser.resume.restart()
    parser.restart()
    retry = [
        {**_chunk("", role="assistant"), "id": "c2"},
        {**_chunk("Hello wor"), "id": "c2"},
        {**_chunk("ld"), "id": "c2"},
    ]
    out = parser.feed(_sse(retry))
    sent = [json.loads(line[6:]) for line in out.decode().splitlines() if line.startswith("data: ")]
    assert [e["choices"][0]["delta"] for e in sent] == [{"content": "wor"}, {"content": "ld"}]
    assert {e["id"] for e in sent} == {"c1"} and parser.resume.sent_text == "Hello world"
    # every chunk read again for an answer LiteLLM's builder makes: as read, as trimmed, one id
    kept = parser.chunks()
    assert [c["choices"][0]["delta"] for c in kept] == [
        {"role": "assistant", "content": ""},
        {"content": "Hello "},
        {"content": "wor"},
        {"content": "ld"},
    ]
    assert {c["id"] for c in kept} == {"c1"}


def test_parser_reads_its_chunks_again_as_they_were_on_the_way() -> None:
    """The chunks kept for an answer that is not plain text: each one's JSON as read (usage
    included, though the client was not sent it), and the stream's first id on every later chunk
    that has one, as `StreamResume.sent` gave it on the way."""
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    events = [
        {k: v for k, v in _chunk(role="assistant").items() if k != "id"},  # no id yet: the next one's counts
        {**_chunk(), "id": "x1", "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]},
        {**_chunk(finish="tool_calls"), "id": "x2"},
        {"id": "x3", "choices": [], "usage": usage},
    ]
    parser = SseParser(True)
    parser.feed(_sse(events))
    assert not parser.resume.spliceable
    kept = parser.chunks()
    assert "id" not in kept[0] and [c["id"] for c in kept[1:]] == ["x1", "x1", "x1"]
    assert kept[3]["usage"] == usage and [c["choices"] for c in kept[1:3]] == [e["choices"] for e in events[1:3]]
    answer = parser.answer([{"role": "user", "content": "call f"}])
    assert answer is not None and answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"


def test_wire_model_and_config() -> None:
    assert wire_model("openai/smollm2") == "smollm2" and wire_model("hosted_vllm/org/model") == "org/model"
    assert wire_model("anthropic/claude") is None and wire_model("gpt-4o") is None
    with pytest.raises(ConfigError, match="forward"):
        parse_config({"routes": [{"name": "x", "model": "*", "routing": {"forward": "bytes"}}]})


def test_price_lookup() -> None:
    """A stored answer's price comes from LiteLLM's local map; a model it cannot price says so
    (None) so the pipeline asks only once."""
    from kvgate.middleware.answers import cost

    answer = {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 1000, "total_tokens": 2000},
    }
    assert (cost(answer, "gpt-4o-mini") or 0) > 0
    assert cost({**answer, "model": "fake"}, "openai/fake") is None


def _streaming_app(events: list[dict[str, Any]], pause_s: float = 0.0, seen: list[str] | None = None) -> FastAPI:
    """A replica that streams `events` (then [DONE]), `pause_s` apart; `seen` notes a cancelled stream."""
    import asyncio

    from fastapi.responses import StreamingResponse

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> StreamingResponse:
        async def body() -> Any:
            try:
                for event in events:
                    yield f"data: {json.dumps(event)}\n\n"
                    await asyncio.sleep(pause_s)
                yield "data: [DONE]\n\n"
            except asyncio.CancelledError:
                if seen is not None:
                    seen.append("cancelled")
                raise

        return StreamingResponse(body(), media_type="text/event-stream")

    return app


def test_tool_call_stream_is_stored_and_replayed(servers, tmp_path: Path) -> None:
    """A stream that is not plain text (tool calls) is put back together by LiteLLM's builder."""
    start, proxy = servers
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather", "arguments": ""}}
    events = [
        _chunk(role="assistant"),
        {**_chunk(), "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]},
        {
            **_chunk(),
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}]},
                    "finish_reason": None,
                }
            ],
        },
        _chunk(finish="tool_calls"),
    ]
    replica = start(_streaming_app(events))
    p = proxy(tmp_path, [replica.url], "relay")
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}]
    miss = p.chat("weather in Oslo?", stream=True, tools=tools)
    hit = p.chat("weather in Oslo?", stream=True, tools=tools)
    assert miss.headers["x-kvgate-cache"] == "miss" and hit.headers["x-kvgate-cache"] == "exact", hit.text
    calls = [
        c
        for e in _events(hit)
        if e != "[DONE]"
        for ch in e["choices"]
        for c in (ch.get("delta") or {}).get("tool_calls") or []
    ]
    assert (
        calls and calls[0]["function"]["name"] == "weather" and calls[0]["function"]["arguments"] == '{"city": "Oslo"}'
    )


def test_client_leaving_mid_stream_frees_the_replica(servers, tmp_path: Path) -> None:
    """The client closes after the first events: the replica's stream is dropped, nothing is
    stored, and the router no longer counts the request in flight."""
    import time

    start, proxy = servers
    seen: list[str] = []
    replica = start(
        _streaming_app(
            [_chunk("", role="assistant")] + [_chunk(f"w{i} ") for i in range(100)] + [_chunk(finish="stop")],
            pause_s=0.05,
            seen=seen,
        )
    )
    p = proxy(tmp_path, [replica.url], "relay")
    body = {"model": "fake-1", "messages": [{"role": "user", "content": "long one"}], "stream": True}
    with p.http.stream("POST", "/v1/chat/completions", json=body) as resp:
        lines = resp.iter_lines()
        assert next(lines).startswith("data: ")
    router = p.pipeline.routers["local"]
    deadline = time.time() + 10
    while (router.stats()["r0"]["in_flight"] or not seen) and time.time() < deadline:
        time.sleep(0.05)
    assert router.stats()["r0"]["in_flight"] == 0 and seen == ["cancelled"]
    assert len(p.pipeline.index) == 0
