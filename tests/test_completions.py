"""POST /v1/completions end to end: openai client / httpx → proxy → pipeline → fake backend (LiteLLM's
text completion, and the relay on a route with replicas); the SDK's text_completion."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from kvgate.middleware.config import parse_config
from kvgate.middleware.sdk.client import Gateway, cache_info

PROMPT = "The capital of France is"


def post(proxy, body: dict, key: str = "key-a", **headers: str) -> httpx.Response:
    return proxy.http.post(
        "/v1/completions", json={"model": "demo-1", **body}, headers={"authorization": f"Bearer {key}", **headers}
    )


def sse(resp: httpx.Response) -> tuple[str, list[dict]]:
    assert resp.status_code == 200, resp.text
    events = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    return "".join(c["choices"][0]["text"] for c in chunks if c.get("choices")), chunks


def relay_config(api_base: str, cache_dir, **route) -> dict:
    """One route whose two replicas are the fake backend: misses take the relay."""
    return {
        "cache_dir": str(cache_dir),
        "routes": [
            {
                "name": "r",
                "model": "demo-*",
                "backend": {"model": "openai/served", "api_key": "none"},
                "semantic": {"enabled": False},
                "replicas": [{"name": "a", "api_base": api_base}, {"name": "b", "api_base": api_base}],
                **route,
            }
        ],
    }


@pytest.fixture(params=["litellm", "relay"])
def proxy(request, make_proxy, backend, tmp_path):
    if request.param == "litellm":
        return make_proxy()
    return make_proxy(raw=relay_config(backend.api_base, tmp_path / "relay-cache"))


def test_string_prompt_miss_then_exact_hit(proxy, backend):
    first = post(proxy, {"prompt": PROMPT, "max_tokens": 8})
    assert first.status_code == 200, first.text
    assert first.headers["x-kvgate-cache"] == "miss"
    body = first.json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"].endswith(PROMPT)
    calls = backend.count
    second = post(proxy, {"prompt": PROMPT, "max_tokens": 8})
    assert second.headers["x-kvgate-cache"] == "exact"
    assert second.json()["choices"] == body["choices"]
    assert backend.count == calls
    # the chat endpoint never serves a completions entry, nor the other way round
    chat = proxy.chat(PROMPT, max_tokens=8)
    assert chat.headers["x-kvgate-cache"] == "miss"


def test_token_id_prompt_is_keyed_by_its_ids(proxy, backend):
    first = post(proxy, {"prompt": [1, 2, 3], "max_tokens": 8})
    assert first.status_code == 200, first.text
    assert first.headers["x-kvgate-cache"] == "miss"
    assert post(proxy, {"prompt": [1, 2, 3], "max_tokens": 8}).headers["x-kvgate-cache"] == "exact"
    assert post(proxy, {"prompt": [1, 2, 4], "max_tokens": 8}).headers["x-kvgate-cache"] == "miss"
    # the text "1 2 3" is another prompt
    assert post(proxy, {"prompt": "1 2 3", "max_tokens": 8}).headers["x-kvgate-cache"] == "miss"


def test_streamed_hit_replays_the_miss_byte_for_byte(proxy, backend):
    body = {"prompt": PROMPT + " streamed", "stream": True, "max_tokens": 8}
    miss = post(proxy, body)
    text, _ = sse(miss)
    assert miss.headers["x-kvgate-cache"] == "miss" and text.endswith("streamed")
    hit = post(proxy, body)
    assert hit.headers["x-kvgate-cache"] == "exact"
    assert hit.content == miss.content
    # a client that asks for usage gets the usage event as well
    usage = post(proxy, {**body, "stream_options": {"include_usage": True}})
    text_u, chunks = sse(usage)
    assert text_u == text and chunks[-1]["usage"]["total_tokens"] > 0
    # a non-streamed request is served from the streamed answer
    plain = post(proxy, {**body, "stream": False})
    assert plain.headers["x-kvgate-cache"] == "exact" and plain.json()["choices"][0]["text"] == text


def test_uncacheable_requests_are_forwarded_and_say_why(proxy, backend):
    for params, why in [
        ({"n": 2, "temperature": 0.8}, "n>1 with temperature>0"),
        ({"logprobs": 1}, "logprobs"),
        ({"echo": True}, "echo"),
    ]:
        for _ in range(2):
            resp = post(proxy, {"prompt": PROMPT + why, "max_tokens": 4, **params})
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-kvgate-cache"] == "miss"
            assert resp.headers["x-kvgate-cache-skipped"] == why
    # n > 1 with greedy decoding is a function of the key: cached
    post(proxy, {"prompt": PROMPT + " n2", "n": 2, "temperature": 0})
    assert post(proxy, {"prompt": PROMPT + " n2", "n": 2, "temperature": 0}).headers["x-kvgate-cache"] == "exact"


def test_batch_splits_into_requests_and_joins_in_order(proxy, backend):
    post(proxy, {"prompt": "second prompt", "max_tokens": 8})  # cached ahead: the batch mixes a hit and misses
    resp = post(proxy, {"prompt": ["first prompt", "second prompt", "zebra crossing lights at night"], "max_tokens": 8})
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-kvgate-cache"] == "miss,exact,miss"
    choices = resp.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert choices[0]["text"].endswith("first prompt") and choices[1]["text"].endswith("second prompt")
    assert choices[2]["text"].endswith("zebra crossing lights at night")
    assert resp.json()["usage"]["total_tokens"] > 0
    ids = post(proxy, {"prompt": [[5, 6, 7], [8, 9]], "max_tokens": 8})
    assert [c["text"].split(": ", 1)[1] for c in ids.json()["choices"]] == ["5 6 7", "8 9"]
    streamed = post(
        proxy,
        {
            "prompt": ["first prompt", "second prompt"],
            "stream": True,
            "max_tokens": 8,
            "stream_options": {"include_usage": True},
        },
    )
    _, chunks = sse(streamed)
    by_index: dict[int, str] = {}
    for c in chunks:
        for choice in c.get("choices") or []:
            by_index[choice["index"]] = by_index.get(choice["index"], "") + choice["text"]
    assert by_index[0] == choices[0]["text"] and by_index[1] == choices[1]["text"]
    assert chunks[-1]["usage"]["total_tokens"] > 0


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, -2]}, "prompt[1]"),
        ({"prompt": ["ok", ""]}, "prompt[1]"),
        ({"prompt": PROMPT, "n": 0}, "n"),
        ({"prompt": 12}, "prompt"),
        ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
    ],
)
def test_bad_input_is_refused_before_the_backend(proxy, backend, body, param):
    calls = backend.count
    resp = post(proxy, body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert backend.count == calls


def test_openai_client_string_and_token_prompts(proxy, backend):
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="key-a", max_retries=0)
    first = client.completions.create(model="demo-1", prompt="openai client prompt", max_tokens=8)
    assert first.choices[0].text.endswith("openai client prompt")
    again = client.completions.with_raw_response.create(model="demo-1", prompt="openai client prompt", max_tokens=8)
    assert again.headers["x-kvgate-cache"] == "exact" and again.parse().choices[0].text == first.choices[0].text
    streamed = client.completions.create(model="demo-1", prompt=[7, 8, 9], max_tokens=8, stream=True)
    text = "".join(c.choices[0].text for c in streamed if c.choices)
    assert text.endswith("7 8 9")


def test_tenants_do_not_share_completions(proxy, backend):
    post(proxy, {"prompt": "tenant prompt"}, key="key-a")
    assert post(proxy, {"prompt": "tenant prompt"}, key="key-b").headers["x-kvgate-cache"] == "miss"
    assert post(proxy, {"prompt": "tenant prompt"}, key="key-a").headers["x-kvgate-cache"] == "exact"
    assert (
        post(proxy, {"prompt": "tenant prompt"}, key="key-a", **{"x-kvgate-cache-control": "no-cache"}).headers[
            "x-kvgate-cache"
        ]
        == "miss"
    )


def test_feedback_by_request_id_removes_a_completions_answer(proxy, backend):
    miss = post(proxy, {"prompt": "feedback prompt"})
    rid = miss.headers["x-kvgate-request-id"]
    assert post(proxy, {"prompt": "feedback prompt"}).headers["x-kvgate-cache"] == "exact"
    resp = proxy.http.post(
        "/v1/cache/feedback", json={"request_id": rid, "correct": False}, headers={"authorization": "Bearer key-a"}
    )
    assert resp.status_code == 200, resp.text
    assert post(proxy, {"prompt": "feedback prompt"}).headers["x-kvgate-cache"] == "miss"


def test_semantic_tier_on_a_completions_route(make_proxy, backend, tmp_path):
    raw = {
        "cache_dir": str(tmp_path / "sem"),
        "routes": [
            {
                "name": "text",
                "model": "demo-*",
                "endpoints": ["completions"],
                "backend": {"model": "openai/served", "api_base": backend.api_base, "api_key": "sk-x"},
                "semantic": {"enabled": True, "threshold": 0.9},
            },
            {
                "name": "chat",
                "model": "demo-*",
                "endpoints": ["chat"],
                "backend": {"model": "openai/served", "api_base": backend.api_base, "api_key": "sk-x"},
                "semantic": {"enabled": False},
            },
        ],
    }
    proxy = make_proxy(raw=raw)
    post(proxy, {"prompt": "What is the capital of France?"})
    hit = post(proxy, {"prompt": "Tell me the capital city of France"})
    assert hit.headers["x-kvgate-cache"] == "semantic" and hit.headers["x-kvgate-route"] == "text"
    assert proxy.chat("What is the capital of France?").headers["x-kvgate-route"] == "chat"


def test_semantic_tier_needs_turning_on_for_completions(make_proxy, backend):
    proxy = make_proxy()  # the route's semantic tier is on by default: for chat only
    post(proxy, {"prompt": "What is the capital of France?"})
    assert post(proxy, {"prompt": "Tell me the capital city of France"}).headers["x-kvgate-cache"] == "miss"
    proxy.chat("What is the capital of France?")
    assert proxy.chat("Tell me the capital city of France").headers["x-kvgate-cache"] == "semantic"


def test_sdk_text_completion(backend, tmp_path, embedder):
    config = parse_config(
        {
            "cache_dir": str(tmp_path / "sdk"),
            "routes": [
                {
                    "name": "r",
                    "model": "demo-*",
                    "semantic": {"enabled": False},
                    "backend": {"model": "openai/served", "api_base": backend.api_base, "api_key": "sk-x"},
                }
            ],
        }
    )
    from kvgate.middleware.build import build_pipeline

    with Gateway(config, pipeline=build_pipeline(config, embedder=embedder)) as gw:
        first = gw.text_completion(model="demo-1", prompt="sdk prompt", max_tokens=8)
        assert first.choices[0].text.endswith("sdk prompt") and cache_info(first).cache == "miss"
        second = gw.text_completion(model="demo-1", prompt="sdk prompt", max_tokens=8)
        assert cache_info(second).cache == "exact" and second.choices[0].text == first.choices[0].text
        stream = gw.text_completion(model="demo-1", prompt="sdk prompt", max_tokens=8, stream=True)
        assert "".join(c.choices[0].text for c in stream) == first.choices[0].text
        assert stream.kvgate.cache == "exact"


def test_failover_to_the_next_replica(make_proxy, backend, tmp_path):
    raw = relay_config(backend.api_base, tmp_path / "failover")
    raw["routes"][0]["replicas"][0]["api_base"] = "http://127.0.0.1:9/v1"  # nothing listens there
    raw["routes"][0]["routing"] = {"policy": "round_robin"}
    proxy = make_proxy(raw=raw)
    for i in range(3):
        resp = post(proxy, {"prompt": f"failover prompt {i}", "max_tokens": 8})
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-kvgate-replica"] == "b"


def test_a_hit_carries_its_receipt(proxy, backend):
    miss = post(proxy, {"prompt": "receipt prompt"})
    assert "x-kvgate-entry-id" not in miss.headers
    time.sleep(0.2)
    hit = post(proxy, {"prompt": "receipt prompt"})
    assert hit.headers["x-kvgate-cache"] == "exact"
    assert int(hit.headers["x-kvgate-entry-id"]) >= 0 and float(hit.headers["x-kvgate-entry-age"]) >= 0.2
    chat_miss = proxy.chat("receipt chat")
    chat_hit = proxy.chat("receipt chat")
    assert chat_hit.headers["x-kvgate-entry-id"] != hit.headers["x-kvgate-entry-id"]
    assert "x-kvgate-entry-id" not in chat_miss.headers
