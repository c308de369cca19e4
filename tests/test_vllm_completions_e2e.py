"""/v1/completions through kvgate in front of the session's two real vLLM servers: precise routing of
raw prompts (text and token ids), the openai client, a streamed hit replayed byte for byte, the
engine's own errors, and vLLM's benchmark client with its default backend (prefix_repetition and
a multi-turn run, 0 failed requests)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest

from kvgate.engines.vllm.launch import default_model_dir, vllm_python
from kvgate.tools.bench.vllm_bench_client import multi_turn_prompts, run_vllm_bench
from tests.test_vllm_connector_e2e import FACTS
from tests.test_vllm_e2e import LONG, Proxy, config


@pytest.fixture
def proxy(tmp_path: Path, vllm_pair: list[Any]) -> Iterator[Proxy]:
    p = Proxy(config(tmp_path, vllm_pair))
    yield p
    p.close()


def complete(p: Proxy, prompt: Any, tenant: str = "alice", **extra: Any) -> httpx.Response:
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 8, "temperature": 0, **extra}
    r = p.client.post("/v1/completions", json=body, headers={"authorization": f"Bearer {tenant}"})
    assert r.status_code == 200, r.text
    return r


def cached(r: httpx.Response) -> int:
    return int(((r.json().get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def test_raw_prompts_are_routed_precisely(proxy: Proxy) -> None:
    """A text prompt's next turn goes where its prefix is, and the engine reports the cached
    tokens the router expected (to the block): the router cut the prompt as the engine did."""
    assert proxy.router.hasher is not None or _wait_hasher(proxy)
    block = proxy.router.block_size
    first = complete(proxy, "Completions: " + LONG)
    second = complete(proxy, "Completions: " + LONG + " And one more line about the bridge.")
    assert second.headers["x-kvgate-replica"] == first.headers["x-kvgate-replica"]
    expected = int(second.headers["x-kvgate-expected-cached-tokens"])
    assert expected >= block and abs(cached(second) - expected) < block, (expected, cached(second))
    # the same prompt as token ids (the engine's own tokenizer, as the router holds it)
    ids = proxy.router.hasher.tokens(_text("Token ids: " + LONG))
    complete(proxy, ids)
    again = complete(proxy, ids + ids[:40])
    expected = int(again.headers["x-kvgate-expected-cached-tokens"])
    assert expected >= block and abs(cached(again) - expected) < block, (expected, cached(again))


def test_openai_client_and_engine_errors(proxy: Proxy) -> None:
    client = openai.OpenAI(base_url=f"{proxy.server.url}/v1", api_key="alice", max_retries=0)
    plain = client.completions.create(model="smollm2", prompt="The sky is", max_tokens=6, temperature=0)
    streamed = client.completions.create(model="smollm2", prompt="The sky is", max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == plain.choices[0].text
    ids = client.completions.create(model="smollm2", prompt=[504, 6175, 314], max_tokens=4, temperature=0)
    assert ids.choices[0].finish_reason in ("stop", "length")
    sent = sum(r.requests for r in proxy.router.replicas)
    with pytest.raises(openai.BadRequestError) as refused:  # past the engines' context: refused here
        client.completions.create(model="smollm2", prompt="word " * 9000, max_tokens=4)
    assert "maximum context length" in str(refused.value)
    with pytest.raises(openai.BadRequestError) as refused:  # a token id outside the engine's vocabulary
        client.completions.create(model="smollm2", prompt=[1, 10**9], max_tokens=4)
    assert "out of vocabulary" in str(refused.value)
    assert sum(r.requests for r in proxy.router.replicas) == sent  # no replica saw either


def test_streamed_hit_replays_vllm_bytes(tmp_path: Path, vllm_pair: list[Any]) -> None:
    cfg = config(tmp_path, vllm_pair)
    cfg["routes"][0]["exact"] = True
    p = Proxy(cfg)
    try:
        # a stop string ends the answer normally (an answer cut by max_tokens is not stored)
        body = {
            "model": "smollm2",
            "prompt": "Once upon a time",
            "max_tokens": 64,
            "temperature": 0,
            "stream": True,
            "stop": ["."],
        }
        headers = {"authorization": "Bearer alice"}
        miss = p.client.post("/v1/completions", json=body, headers=headers)
        hit = p.client.post("/v1/completions", json=body, headers=headers)
        assert (miss.headers["x-kvgate-cache"], hit.headers["x-kvgate-cache"]) == ("miss", "exact")
        assert hit.content == miss.content and miss.content.endswith(b"data: [DONE]\n\n")
    finally:
        p.close()


def test_vllm_benchmark_client_default_backend(proxy: Proxy, tmp_path: Path) -> None:
    model = str(default_model_dir())
    common = ["--request-rate", "inf", "--max-concurrency", "2"]
    prefix = run_vllm_bench(
        str(vllm_python()),
        proxy.server.url,
        model,
        "smollm2",
        [
            "--dataset-name",
            "prefix_repetition",
            "--num-prompts",
            "8",
            "--prefix-repetition-prefix-len",
            "256",
            "--prefix-repetition-suffix-len",
            "32",
            "--prefix-repetition-num-prefixes",
            "2",
            "--prefix-repetition-output-len",
            "4",
            *common,
        ],
        tmp_path / "prefix",
    )
    assert (prefix["completed"], prefix["failed"]) == (8, 0)
    turns = multi_turn_prompts(tmp_path / "turns.jsonl", conversations=2, turns=3)
    multi = run_vllm_bench(
        str(vllm_python()),
        proxy.server.url,
        model,
        "smollm2",
        [
            "--dataset-name",
            "custom",
            "--dataset-path",
            str(turns),
            "--skip-chat-template",
            "--num-prompts",
            "6",
            "--custom-output-len",
            "4",
            *common,
        ],
        tmp_path / "multi",
    )
    assert (multi["completed"], multi["failed"]) == (6, 0)


def test_next_turn_on_the_other_engine_loads_from_the_shared_tier(vllm_pair: list[Any]) -> None:
    """The engines' KV connector keys their own block hashes, so a completions conversation's next
    turn loads its history on an engine that never computed it, as a chat's does."""
    a, b = vllm_pair

    def ask(server: Any, prompt: str) -> tuple[str, int, int]:
        body = {"model": "smollm2", "prompt": prompt, "max_tokens": 12, "temperature": 0}
        r = httpx.post(f"{server.api_base}/completions", json=body, timeout=180)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        return (
            r.json()["choices"][0]["text"],
            usage["prompt_tokens"],
            int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
        )

    first = f"Session {uuid.uuid4()}. Remember: {FACTS}\nQuestion: which gate opens first?\nAnswer:"
    answer, history, _ = ask(a, first)
    later = first + answer + "\nQuestion: what is the keeper's dog called?\nAnswer:"
    time.sleep(1.0)  # the connector writes chunks in the background
    text_b, _, cached_b = ask(b, later)  # b never computed this conversation
    text_a, _, _ = ask(a, later)
    assert cached_b >= (history - 1) // 128 * 128 > 0
    assert text_b == text_a


def _text(text: str) -> Any:
    from kvgate.index.kv.prompt import TextPrompt

    return TextPrompt(text)


def _wait_hasher(p: Proxy) -> bool:
    from tests.conftest import wait_until

    complete(p, "warm up")  # the route's first request asks the engines how to hash
    return wait_until(lambda: p.router.hasher is not None, 60)
