"""The SDK face: Gateway.completion / acompletion through real LiteLLM to a fake backend."""

from __future__ import annotations

import time

import pytest

from kvgate import Gateway, cache_info
from kvgate.middleware.errors import BackendError, BadRequest, ModelNotFound
from tests.conftest import route_config

PARIS = "What is the capital of France?"
PARAPHRASE = "Tell me the capital city of France"


def ask(content, **kw):
    messages = content if isinstance(content, list) else [{"role": "user", "content": content}]
    return {"model": kw.pop("model", "demo-1"), "messages": messages, **kw}


@pytest.fixture
def gateway(embedder, backend, tmp_path):
    from kvgate.middleware.build import build_pipeline
    from kvgate.middleware.config import parse_config

    config = parse_config(route_config(backend.api_base, tmp_path / "cache"))
    gw = Gateway(config, pipeline=build_pipeline(config, embedder=embedder))
    yield gw
    gw.close()


def test_exact_and_semantic_hits(gateway, backend):
    first = gateway.completion(**ask(PARIS))
    assert cache_info(first).cache == "miss"
    calls = backend.count
    again = gateway.completion(**ask(PARIS))
    para = gateway.completion(**ask(PARAPHRASE))
    assert cache_info(again).cache == "exact"
    info = cache_info(para)
    assert info.cache == "semantic" and info.similarity >= 0.9
    assert para._hidden_params["cache_hit"] is True
    assert again.choices[0].message.content == para.choices[0].message.content == first.choices[0].message.content
    assert backend.count == calls


@pytest.mark.parametrize(
    "variant",
    [{"cache": {"namespace": "other-tenant"}}, {"model": "demo-2"}, {"temperature": 0.3}, {"top_p": 0.5}],
    ids=["tenant", "model", "temperature", "top_p"],
)
def test_scope_differences_miss(gateway, variant):
    gateway.completion(**ask(PARIS))
    assert cache_info(gateway.completion(**ask(PARIS, **variant))).cache == "miss"


def test_earlier_turns_scope(gateway):
    history = [
        {"role": "user", "content": "Tell me about Italy."},
        {"role": "assistant", "content": "Italy is in Europe."},
    ]
    other = [
        {"role": "user", "content": "Tell me about Peru."},
        {"role": "assistant", "content": "Peru is in South America."},
    ]
    follow = {"role": "user", "content": "What is its capital?"}
    assert cache_info(gateway.completion(**ask(history + [follow]))).cache == "miss"
    assert cache_info(gateway.completion(**ask(other + [follow]))).cache == "miss"
    assert cache_info(gateway.completion(**ask(history + [follow]))).cache == "exact"


def test_cache_kwarg_controls(gateway, backend):
    gateway.completion(**ask(PARIS))
    calls = backend.count
    fresh = gateway.completion(**ask(PARIS, cache={"no-cache": True}))
    assert cache_info(fresh).cache == "miss" and backend.count == calls + 1
    q = "Name a prime number."
    gateway.completion(**ask(q, cache={"no-store": True}))
    assert cache_info(gateway.completion(**ask(q))).cache == "miss"
    t = "What colour is the sea?"
    gateway.completion(**ask(t, cache={"ttl": 1}))
    assert cache_info(gateway.completion(**ask(t))).cache == "exact"
    time.sleep(1.3)
    assert cache_info(gateway.completion(**ask(t))).cache == "miss"


def test_sync_stream_hit_and_miss(gateway):
    miss = gateway.completion(**ask("Why is grass green?", stream=True))
    assert miss.kvgate.cache == "miss"
    text = "".join(c.choices[0].delta.content or "" for c in miss if c.choices)
    hit = gateway.completion(**ask("Why is grass green?", stream=True))
    assert hit.kvgate.cache == "exact"
    chunks = list(hit)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert cache_info(chunks[0]).cache == "exact"


async def test_async_paths(gateway, backend):
    first = await gateway.acompletion(**ask("What is the tallest mountain on Earth?"))
    assert cache_info(first).cache == "miss"
    para = await gateway.acompletion(**ask("Which mountain is the tallest on Earth?"))
    assert cache_info(para).cache == "semantic"  # other words: never the exact tier
    assert para.choices[0].message.content == first.choices[0].message.content
    stream = await gateway.acompletion(**ask("What is the tallest mountain on Earth?", stream=True))
    assert stream.kvgate.cache == "exact"
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == first.choices[0].message.content
    miss = await gateway.acompletion(**ask("How deep is the ocean?", stream=True))
    streamed = "".join([c.choices[0].delta.content or "" async for c in miss if c.choices])
    stored = await gateway.acompletion(**ask("How deep is the ocean?"))
    assert cache_info(stored).cache == "exact" and stored.choices[0].message.content == streamed


def test_errors(gateway):
    with pytest.raises(ModelNotFound, match="demo-"):
        gateway.completion(**ask(PARIS, model="nope"))
    with pytest.raises(BadRequest, match="messages"):
        gateway.completion(model="demo-1", messages=[])
    with pytest.raises(BadRequest, match="role"):
        gateway.completion(model="demo-1", messages=[{"role": "robot", "content": "x"}])
    with pytest.raises(BackendError, match="exploded"):
        gateway.completion(**ask("[[fail]]"))
    assert cache_info(gateway.completion(**ask("[[length]] cut"))).stored is False


def test_config_from_yaml_file(tmp_path, backend):
    path = tmp_path / "kvgate.yaml"
    path.write_text(
        f"""
cache_dir: {tmp_path / "c"}
routes:
  - name: chat
    model: "demo-*"
    backend: {{model: openai/served-name, api_base: {backend.api_base}, api_key: sk-x}}
    ttl: 86400
    scope: tenant
    semantic: {{threshold: 0.9, context: exact}}
"""
    )
    with Gateway(path) as gw:
        gw.completion(**ask(PARIS))
        assert cache_info(gw.completion(**ask(PARAPHRASE))).cache == "semantic"
