"""End-to-end: fake backend ← LiteLLM ← pipeline ← proxy (uvicorn) ← openai client / httpx."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

PARIS = "What is the capital of France?"
PARAPHRASE = "Tell me the capital city of France"


def answer(resp: httpx.Response) -> str:
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["message"]["content"]


def sse_text(resp: httpx.Response) -> tuple[str, list[dict]]:
    assert resp.status_code == 200, resp.text
    events = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c.get("choices"))
    return text, chunks


def test_repeat_is_exact_hit_without_backend_call(make_proxy, backend):
    proxy = make_proxy()
    first = proxy.chat(PARIS)
    assert first.headers["x-kvgate-cache"] == "miss"
    calls = backend.count
    second = proxy.chat(PARIS)
    assert second.headers["x-kvgate-cache"] == "exact"
    assert answer(second) == answer(first)
    assert backend.count == calls


def test_paraphrase_is_semantic_hit_via_openai_client(make_proxy, backend):
    proxy = make_proxy()
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="key-a", max_retries=0)
    first = client.chat.completions.with_raw_response.create(
        model="demo-1", messages=[{"role": "user", "content": PARIS}]
    )
    assert first.headers["x-kvgate-cache"] == "miss"
    calls = backend.count
    hit = client.chat.completions.with_raw_response.create(
        model="demo-1", messages=[{"role": "user", "content": PARAPHRASE}]
    )
    assert hit.headers["x-kvgate-cache"] == "semantic"
    assert float(hit.headers["x-kvgate-similarity"]) >= 0.9
    assert hit.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert backend.count == calls


@pytest.mark.parametrize(
    "variant",
    [
        {"key": "key-b"},  # another tenant
        {"model": "demo-2"},  # another model
        {"temperature": 0.7},  # another output-affecting parameter
        {"max_tokens": 5},
    ],
    ids=["tenant", "model", "temperature", "max_tokens"],
)
def test_scope_differences_miss(make_proxy, backend, variant):
    proxy = make_proxy()
    assert proxy.chat(PARIS).headers["x-kvgate-cache"] == "miss"
    calls = backend.count
    resp = proxy.chat(PARIS, **variant)
    assert resp.headers["x-kvgate-cache"] == "miss", variant
    assert backend.count == calls + 1
    # within that other scope the paraphrase now finds the entry just stored there
    assert proxy.chat(PARAPHRASE, **variant).headers["x-kvgate-cache"] == "semantic"


def test_different_earlier_turns_miss(make_proxy):
    proxy = make_proxy()
    conv_a = [
        {"role": "user", "content": "I am planning a trip to Japan."},
        {"role": "assistant", "content": "Great, Japan is lovely."},
        {"role": "user", "content": "What famous landmark is there?"},
    ]
    conv_b = [
        {"role": "user", "content": "I am planning a trip to Egypt."},
        {"role": "assistant", "content": "Great, Egypt is lovely."},
        {"role": "user", "content": "What famous landmark is there?"},
    ]
    assert proxy.chat(conv_a).headers["x-kvgate-cache"] == "miss"
    assert proxy.chat(conv_b).headers["x-kvgate-cache"] == "miss"
    assert proxy.chat(conv_a).headers["x-kvgate-cache"] == "exact"
    paraphrased = conv_a[:-1] + [{"role": "user", "content": "Which famous landmark is there?"}]
    assert proxy.chat(paraphrased).headers["x-kvgate-cache"] == "semantic"


def test_system_prompt_scopes(make_proxy):
    proxy = make_proxy()
    pirate = [{"role": "system", "content": "Answer like a pirate."}, {"role": "user", "content": PARIS}]
    assert proxy.chat(PARIS).headers["x-kvgate-cache"] == "miss"
    assert proxy.chat(pirate).headers["x-kvgate-cache"] == "miss"


def test_shared_scope_crosses_tenants(make_proxy):
    proxy = make_proxy()
    assert proxy.chat(PARIS, model="shared-1", key="key-a").headers["x-kvgate-cache"] == "miss"
    assert proxy.chat(PARIS, model="shared-1", key="key-b").headers["x-kvgate-cache"] == "exact"
    assert proxy.chat(PARAPHRASE, model="shared-1", key="key-c").headers["x-kvgate-cache"] == "semantic"


def test_no_cache_and_no_store(make_proxy, backend):
    proxy = make_proxy()
    proxy.chat(PARIS)
    calls = backend.count
    fresh = proxy.chat(PARIS, headers={"x-kvgate-cache-control": "no-cache"})
    assert fresh.headers["x-kvgate-cache"] == "miss" and backend.count == calls + 1
    # no-cache still stores: the fresh answer replaced the old one
    assert answer(proxy.chat(PARIS)) == answer(fresh)

    q = "How many legs does a spider have?"
    assert proxy.chat(q, headers={"x-kvgate-cache-control": "no-store"}).headers["x-kvgate-cache"] == "miss"
    assert proxy.chat(q).headers["x-kvgate-cache"] == "miss"  # nothing was written
    assert proxy.chat(q).headers["x-kvgate-cache"] == "exact"


def test_streamed_hit_replays_the_original_text(make_proxy, backend):
    proxy = make_proxy()
    original = answer(proxy.chat(PARIS))
    calls = backend.count
    for question, tier in ((PARIS, "exact"), (PARAPHRASE, "semantic")):
        resp = proxy.chat(question, stream=True, stream_options={"include_usage": True})
        assert resp.headers["x-kvgate-cache"] == tier
        assert resp.headers["content-type"].startswith("text/event-stream")
        text, chunks = sse_text(resp)
        assert text == original
        assert chunks[-1]["usage"]["total_tokens"] > 0
        assert any(c["choices"] and c["choices"][0].get("finish_reason") == "stop" for c in chunks)
    assert backend.count == calls


def test_streamed_miss_passes_through_and_is_stored(make_proxy, backend):
    proxy = make_proxy()
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="key-a", max_retries=0)
    stream = client.chat.completions.create(
        model="demo-1", messages=[{"role": "user", "content": "Why is the sky blue?"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.startswith("Answer ") and text.endswith("Why is the sky blue?")
    again = proxy.chat("Why is the sky blue?")
    assert again.headers["x-kvgate-cache"] == "exact"
    assert answer(again) == text


def test_length_cut_answers_are_not_stored(make_proxy):
    proxy = make_proxy()
    q = "Write a long essay [[length]]"
    assert proxy.chat(q).headers["x-kvgate-cache"] == "miss"
    assert proxy.chat(q).headers["x-kvgate-cache"] == "miss"
    assert sse_text(proxy.chat(q, stream=True))[0]
    assert proxy.chat(q).headers["x-kvgate-cache"] == "miss"


def test_restart_keeps_the_cache(make_proxy, tmp_path, backend):
    cache = tmp_path / "persist"
    first = make_proxy(cache_dir=cache)
    original = answer(first.chat(PARIS))
    first.stop()
    second = make_proxy(cache_dir=cache)
    calls = backend.count
    exact = second.chat(PARIS)
    semantic = second.chat(PARAPHRASE)
    assert exact.headers["x-kvgate-cache"] == "exact" and answer(exact) == original
    assert semantic.headers["x-kvgate-cache"] == "semantic" and answer(semantic) == original
    assert backend.count == calls


def test_ttl_expiry(make_proxy):
    proxy = make_proxy(ttl=1)
    proxy.chat(PARIS)
    assert proxy.chat(PARIS).headers["x-kvgate-cache"] == "exact"
    time.sleep(1.3)
    assert proxy.chat(PARIS).headers["x-kvgate-cache"] == "miss"
    # per-request ttl overrides the route's
    q = "What is the boiling point of water?"
    proxy.chat(q, headers={"x-kvgate-cache-control": "ttl=600"})
    time.sleep(1.3)
    assert proxy.chat(q).headers["x-kvgate-cache"] == "exact"


@pytest.mark.parametrize(
    "body, field",
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(), "model"),
        (json.dumps({"model": "demo-1", "messages": []}).encode(), "messages"),
        (
            json.dumps({"model": "demo-1", "messages": [{"role": "wizard", "content": "hi"}]}).encode(),
            "messages.0.role",
        ),
        (
            json.dumps(
                {"model": "demo-1", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}
            ).encode(),
            "temperature",
        ),
        (b"\xff\xfe{}", None),
    ],
)
def test_bad_requests_get_openai_errors(make_proxy, body, field):
    proxy = make_proxy()
    resp = proxy.http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if field:
        assert err["param"] == field


def test_unknown_model_is_404_listing_routes(make_proxy):
    resp = make_proxy().chat(PARIS, model="gpt-unknown")
    assert resp.status_code == 404
    err = resp.json()["error"]
    assert err["code"] == "model_not_found" and "demo-*" in err["message"] and "shared-*" in err["message"]


def test_backend_failure_is_502_and_nothing_stored(make_proxy):
    proxy = make_proxy()
    before = proxy.http.get("/health").json()["entries"]
    resp = proxy.chat("please [[fail]]")
    assert resp.status_code == 502
    assert "fake backend exploded" in resp.json()["error"]["message"]
    streamed = proxy.chat("please [[fail]]", stream=True)
    assert streamed.status_code == 502
    assert proxy.http.get("/health").json()["entries"] == before


def test_oversized_body_is_refused(make_proxy, tmp_path, backend):
    from tests.conftest import route_config

    raw = route_config(backend.api_base, tmp_path / "c")
    raw["server"] = {"max_body_bytes": 1000}
    resp = make_proxy(raw=raw).chat("x" * 5000)
    assert resp.status_code == 413 and "max_body_bytes" in resp.json()["error"]["message"]


def test_auth_keys(make_proxy, tmp_path, backend):
    from tests.conftest import route_config

    raw = route_config(backend.api_base, tmp_path / "c")
    raw["auth"] = {"keys": ["good-key"]}
    proxy = make_proxy(raw=raw)
    assert proxy.chat(PARIS, key="bad-key").status_code == 401
    assert proxy.http.post("/v1/chat/completions", json={}).status_code == 401
    assert proxy.chat(PARIS, key="good-key").status_code == 200
    assert proxy.http.get("/v1/models").status_code == 401
    assert proxy.http.get("/health").status_code == 200


def test_models_health_metrics(make_proxy):
    proxy = make_proxy()
    proxy.chat(PARIS)
    proxy.chat(PARIS)
    proxy.chat(PARAPHRASE)
    models = proxy.http.get("/v1/models", headers={"authorization": "Bearer k"}).json()
    assert [m["id"] for m in models["data"]] == ["demo-*", "shared-*"]
    assert proxy.http.get("/health").json()["status"] == "ok"
    metrics = proxy.http.get("/metrics").text
    assert 'kvgate_cache_hits_total{route="chat",tier="exact"} 1.0' in metrics
    assert 'kvgate_cache_hits_total{route="chat",tier="semantic"} 1.0' in metrics
    assert 'kvgate_backend_calls_total{outcome="ok",route="chat"} 1.0' in metrics
    assert "kvgate_request_seconds_bucket" in metrics
    assert "kvgate_tokens_saved_total" in metrics
    assert "kvgate_time_to_first_token_seconds_count" not in metrics  # no streamed request yet
    proxy.chat("A streamed question about rivers", stream=True)
    proxy.chat("A streamed question about rivers", stream=True)
    metrics = proxy.http.get("/metrics").text
    assert 'kvgate_time_to_first_token_seconds_count{cache="miss",route="chat"} 1.0' in metrics
    assert 'kvgate_time_to_first_token_seconds_count{cache="exact",route="chat"} 1.0' in metrics
    assert "key-a" not in metrics and "capital" not in metrics
