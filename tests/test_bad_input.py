"""Malformed, hostile and unusual requests through the real proxy: a clear 4xx or a correct
pass-through, never a 5xx."""

from __future__ import annotations

import json
from typing import Any, Iterator

import httpx
import pytest
from conftest import route_config

CAP = 4096


@pytest.fixture
def proxy(make_proxy, backend, tmp_path):
    raw = route_config(backend.api_base, tmp_path / "bad")
    raw["server"] = {"max_body_bytes": 64_000, "max_tokens_cap": CAP}
    return make_proxy(raw=raw)


def post_raw(proxy: Any, content: bytes | Iterator[bytes], **headers: str) -> httpx.Response:
    return proxy.http.post(
        "/v1/chat/completions",
        content=content,
        headers={"content-type": "application/json", "authorization": "Bearer k", **headers},
    )


def refused(resp: httpx.Response, status: int = 400, param: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"], err
    if param is not None:
        assert (err["param"] or "").startswith(param), err
    return err


USER = [{"role": "user", "content": "How tall is Mount Everest?"}]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [-1, 0, CAP + 1, 10**12, 2**70, "5", 5.5, True])
def test_absurd_token_budgets_are_refused(proxy, field, value):
    resp = proxy.chat(USER, **{field: value})
    err = refused(resp, param=field)
    if isinstance(value, int) and not isinstance(value, bool) and CAP < value <= 1_000_000:
        assert "server.max_tokens_cap" in err["message"] and str(CAP) in err["message"]


def test_token_budget_at_the_cap_passes(proxy):
    assert proxy.chat(USER, max_tokens=CAP).status_code == 200


@pytest.mark.parametrize(
    "body, param",
    [
        ({"stream": "false"}, "stream"),  # strict: a string is not read as True
        ({"temperature": "0"}, "temperature"),
        ({"n": 0}, "n"),
        ({"tools": [{"type": "function"}]}, "tools.0.function"),
        ({"tools": [{"weird": 1}]}, "tools.0"),
        ({"tool_choice": {"anything": []}}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
    ],
)
def test_wrongly_typed_fields_are_refused(proxy, body, param):
    refused(proxy.chat(USER, **body), param=param)


def test_oversized_bodies_declared_or_chunked(proxy):
    big = json.dumps({"model": "demo-1", "messages": [{"role": "user", "content": "x" * 100_000}]}).encode()
    err = refused(post_raw(proxy, big), 413)
    assert "max_body_bytes" in err["message"]

    def chunks() -> Iterator[bytes]:  # no content-length: the proxy counts as it reads
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    refused(post_raw(proxy, chunks()), 413)
    assert proxy.chat("still serving after that?").status_code == 200


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "demo-1", "messages": [{"role": "user", "content": "caf\xe9"}]}',  # latin-1 byte
        b'{"model": "demo-1", "messages": [{"role": "user", "content": "\xc3\x28"}]}',  # bad continuation
        b'{"model": "demo-1", "messages": [{"role": "user", "content": "\\ud800 lone"}]}',  # lone surrogate
        b'{"model": "demo-1", "messages": [{"role": "user", "content": "x"}], "user": "\\udfff"}',
        b'{"model": "demo-1", "messages": [{"role": "user", "\\udc00": "x", "content": "x"}]}',
    ],
)
def test_invalid_unicode_is_400(proxy, raw):
    err = refused(post_raw(proxy, raw))
    assert "UTF" in err["message"] or "surrogate" in err["message"]


def test_escaped_emoji_is_fine(proxy):
    raw = b'{"model": "demo-1", "messages": [{"role": "user", "content": "smile \\ud83d\\ude00"}]}'
    resp = post_raw(proxy, raw)
    assert resp.status_code == 200 and "\U0001f600" in resp.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "messages, param",
    [
        ([], "messages"),
        ("hello", "messages"),
        ([{"role": "wizard", "content": "hi"}], "messages.0.role"),
        ([{"content": "hi"}], "messages.0.role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": None}], "messages[0].content"),
        ([{"role": "user", "content": 42}], "messages.0.content"),
        ([{"role": "user", "content": []}], "messages.0.content"),
        ([{"role": "user", "content": [1, 2]}], "messages.0.content"),
        ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "messages.0.content"),
        ([{"role": "user", "content": [{"text": "no type"}]}], "messages.0.content"),
        ([{"role": "assistant", "content": "hi", "tool_calls": [{"id": "c1"}]}], "messages.0.tool_calls"),
    ],
)
def test_bad_messages_are_400(proxy, messages, param):
    refused(proxy.http.post("/v1/chat/completions", json={"model": "demo-1", "messages": messages}), param=param)


def test_empty_content_passes_through(proxy, backend):
    first = proxy.chat("")
    assert first.status_code == 200, first.text
    assert proxy.chat("").headers["x-kvgate-cache"] == "exact"


def test_image_part_passes_through_exact_only(proxy, backend):
    parts = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    first = proxy.chat([{"role": "user", "content": parts}])
    assert first.status_code == 200, first.text
    assert backend.calls.bodies[-1]["messages"][0]["content"][1]["type"] == "image_url"
    again = proxy.chat([{"role": "user", "content": parts}])
    assert again.headers["x-kvgate-cache"] == "exact"


def test_tool_conversation_passes_through_and_caches(proxy, backend):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 3}'},
    ]
    first = proxy.chat(messages, tools=tools, tool_choice="auto")
    assert first.status_code == 200, first.text
    sent = backend.calls.bodies[-1]
    assert sent["messages"][1]["tool_calls"][0]["id"] == "call_1"
    assert sent["messages"][2] == messages[2] and sent["tools"][0]["function"]["name"] == "weather"
    assert first.headers["x-kvgate-cache"] == "miss"
    calls = backend.count
    again = proxy.chat(messages, tools=tools, tool_choice="auto")  # exact tier; the last turn is no user text
    assert again.headers["x-kvgate-cache"] == "exact" and backend.count == calls
    streamed = proxy.chat(messages, tools=tools, tool_choice="auto", stream=True)
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")


def test_unknown_cache_control_directive_is_400(proxy):
    refused(proxy.chat(USER, headers={"x-kvgate-cache-control": "no-cache, explode"}), param="x-kvgate-cache-control")
    refused(proxy.chat(USER, headers={"x-kvgate-cache-control": "ttl=-5"}))
