"""kvgate in front of two real vLLM servers (the session's `vllm_pair`): precise routing with no
hand settings, tenants salted inside the engine, attribution headers, engine metrics, and a
vLLM server killed under load."""

from __future__ import annotations

import concurrent.futures
import signal
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

import kvgate.index.kv.tokenizer
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import parse_config
from kvgate.middleware.sdk.admin_client import tenant_id
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread
from tests.conftest import wait_until

LONG = " ".join(f"Point {i}: the river town keeps its old stone bridge, its market and its mill." for i in range(40))


def config(tmp: Path, servers: list[Any], **routing: Any) -> dict[str, Any]:
    replicas = [{"name": f"v{i + 1}", "api_base": s.api_base, "events": s.events} for i, s in enumerate(servers)]
    return {
        "cache_dir": str(tmp / "cache"),
        "stats": {"interval_s": 0.2},
        "routes": [
            {
                "name": "vllm",
                "model": "smol*",
                "backend": {"model": "openai/smollm2", "api_key": "none", "timeout": 120},
                "exact": False,
                "semantic": {"enabled": False},
                "scope": "tenant",
                "replicas": replicas,
                "routing": {"policy": "cache_aware", "mode": "precise", **routing},
            }
        ],
    }


class Proxy:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.config = parse_config(cfg)
        self.pipeline = build_pipeline(self.config)
        self.server = ServerThread(create_app(self.config, self.pipeline)).start()
        self.client = httpx.Client(base_url=self.server.url, timeout=120)

    @property
    def router(self) -> Any:
        return self.pipeline.routers["vllm"]

    def chat(
        self, messages: list[dict[str, str]], tenant: str = "alice", stream: bool = False, **extra: Any
    ) -> tuple[httpx.Response, dict[str, Any]]:
        body = {"model": "smollm2", "messages": messages, "max_tokens": 8, "temperature": 0, **extra}
        headers = {"authorization": f"Bearer {tenant}"}
        if not stream:
            r = self.client.post("/v1/chat/completions", json=body, headers=headers)
            return r, (r.json().get("usage") or {}) if r.status_code == 200 else {}
        body["stream"], body["stream_options"] = True, {"include_usage": True}
        usage: dict[str, Any] = {}
        with self.client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and '"usage"' in line:
                    chunk = httpx.Response(200, content=line[6:]).json()
                    usage = chunk.get("usage") or usage
        return r, usage

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        self.pipeline.close()


@pytest.fixture
def proxy_factory(tmp_path: Path) -> Iterator[Any]:
    made: list[Proxy] = []

    def make(cfg: dict[str, Any]) -> Proxy:
        made.append(Proxy(cfg))
        return made[-1]

    yield make
    for p in made:
        p.close()


def cached(usage: dict[str, Any]) -> int:
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


@pytest.mark.parametrize("backend", ["transformers", "tokenizers"])
def test_precise_mode_takes_block_size_and_tokenizer_from_the_engine(
    vllm_pair, proxy_factory, tmp_path, monkeypatch, backend
):
    """With either tokenizer implementation (tokenizers + jinja2: a core install's, without
    transformers), the router's expected cached tokens are the engine's."""
    monkeypatch.setattr(kvgate.index.kv.tokenizer, "tokenizer_backend", lambda: backend)
    proxy = proxy_factory(config(tmp_path, vllm_pair))
    turn1 = [{"role": "user", "content": "Tell me about this town. " + LONG}]
    r1, u1 = proxy.chat(turn1)
    assert r1.status_code == 200, r1.text
    assert proxy.router.engines[r1.headers["x-kvgate-replica"]].kind == "vllm"
    assert proxy.router.block_size == 128  # the CPU build's, learned: the route names none
    assert proxy.router.hasher is not None and proxy.router.hasher.tokenizer.name == Path(vllm_pair[0].model).name
    assert proxy.router.hasher.tokenizer.backend == backend
    first = r1.headers["x-kvgate-replica"]
    assert wait_until(lambda: proxy.router.index.blocks(first) >= u1["prompt_tokens"] // 128, 10)
    answer = r1.json()["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "And its bridge?"}]
    r2, u2 = proxy.chat(turn2, stream=True)
    assert r2.headers["x-kvgate-replica"] == first  # the replica holding the history
    expected = int(r2.headers["x-kvgate-expected-cached-tokens"])
    assert expected >= (u1["prompt_tokens"] // 128) * 128 > 0
    assert cached(u2) == expected  # the router's view is exactly the engine's
    metrics = proxy.client.get("/metrics").text
    assert f'kvgate_replica_reported_cached_tokens_total{{replica="{first}",route="vllm"}} {float(expected)}' in metrics
    precise = proxy.router.precise
    assert wait_until(lambda: precise.check() or precise.counts[first]["matched"] >= 1, 5)  # judged after 1 s
    stats = proxy.router.stats()[first]["precise"]
    assert stats["unmatched"] == 0 and stats["engine_hash"] == "sha256"  # vLLM's default hash, checked


def test_approximate_mode_takes_block_size_and_cache_size_from_the_engine(vllm_pair, proxy_factory, tmp_path):
    """Approximate mode, told only the tokenizer: it hashes in the engine's blocks and bounds each
    replica's index at the engine's KV cache, so what it expects cached counts whole engine blocks."""
    cfg = config(tmp_path, vllm_pair)
    cfg["routes"][0]["routing"] = {"policy": "cache_aware", "prefix": {"tokenizer": vllm_pair[0].model}}
    proxy = proxy_factory(cfg)
    turn1 = [{"role": "user", "content": "Tell me about this town. " + LONG}]
    r1, u1 = proxy.chat(turn1)
    assert r1.status_code == 200, r1.text
    first = r1.headers["x-kvgate-replica"]
    engine = proxy.router.engines[first]
    assert engine.block_size == 128 and engine.kv_cache_tokens  # what the CPU build reports
    assert proxy.router.block_size == 128  # the route names none
    for name, info in proxy.router.engines.items():
        assert proxy.router.index.capacity(name) == info.kv_cache_tokens // 128
    answer = r1.json()["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "And its bridge?"}]
    r2, u2 = proxy.chat(turn2, stream=True)
    assert r2.headers["x-kvgate-replica"] == first
    expected = int(r2.headers["x-kvgate-expected-cached-tokens"])
    assert expected % 128 == 0 and (u1["prompt_tokens"] // 128) * 128 <= expected <= cached(u2)


def test_tenants_are_salted_inside_the_engine(vllm_pair, proxy_factory, tmp_path):
    cfg = config(tmp_path, vllm_pair[:1])  # one replica: every request meets the same prefix cache
    proxy = proxy_factory(cfg)
    prompt = [{"role": "user", "content": "Summarise this note. " + LONG}]
    r, first = proxy.chat(prompt, tenant="tenant-a")
    assert r.status_code == 200 and cached(first) == 0
    assert wait_until(lambda: proxy.router.index.blocks("v1") > 0, 10)
    _, other = proxy.chat(prompt, tenant="tenant-b")
    assert cached(other) == 0  # another tenant cannot hit (or time) tenant A's prefix
    _, chosen = proxy.chat(prompt, tenant="tenant-b", cache_salt=proxy.router.salt("x"))
    assert cached(chosen) == 0  # a client's salt is folded into its tenant's, never used alone
    r, again = proxy.chat(prompt, tenant="tenant-a")
    assert cached(again) >= 128 and cached(again) == int(r.headers["x-kvgate-expected-cached-tokens"])
    assert proxy.router.salt("tenant-a") not in ("tenant-a", None)


def test_an_erased_tenants_prefix_cache_is_unreachable(vllm_pair, proxy_factory, tmp_path):
    """Erasing a tenant bumps its salt epoch: the engine's prefix cache (and kvgate's index of
    it) no longer matches what it cached; its next request prefills from scratch."""
    cfg = config(tmp_path, vllm_pair[:1])
    cfg["auth"] = {"admin_keys": ["admin-key"]}
    proxy = proxy_factory(cfg)
    prompt = [{"role": "user", "content": "Erase me later. " + LONG}]
    proxy.chat(prompt, tenant="tenant-e")
    assert wait_until(lambda: proxy.router.index.blocks("v1") > 0, 10)
    _, warm = proxy.chat(prompt, tenant="tenant-e")
    assert cached(warm) >= 128
    erased = proxy.client.delete(
        f"/v1/admin/tenants/{tenant_id('tenant-e')}", headers={"authorization": "Bearer admin-key"}
    )
    assert erased.status_code == 200 and erased.json()["salt_epoch"] == 1
    r, after = proxy.chat(prompt, tenant="tenant-e")
    assert cached(after) == 0 and int(r.headers["x-kvgate-expected-cached-tokens"]) == 0
    assert wait_until(lambda: proxy.router.index.blocks("v1") > 0, 10)
    _, again = proxy.chat(prompt, tenant="tenant-e")
    assert cached(again) >= 128  # under its new salt, its own prefixes are reusable again


def test_a_tokenizer_that_differs_from_the_engine_is_reported(vllm_pair, proxy_factory, tmp_path):
    # code points are not the model's token ids: the engine stores blocks, none of them ours
    proxy = proxy_factory(config(tmp_path, vllm_pair, tokenizer="codepoints"))
    for i in range(20):
        r, _ = proxy.chat([{"role": "user", "content": f"Note {i}. " + LONG}], tenant="bob")
        assert r.status_code == 200
        if wait_until(lambda: sum(c["unmatched"] for c in proxy.router.precise.counts.values()) > 0, 1.5):
            break
    assert sum(c["unmatched"] for c in proxy.router.precise.counts.values()) > 0
    assert "kvgate_precise_unmatched_requests_total" in proxy.client.get("/metrics").text


def test_engine_metrics_in_stats(vllm_pair, proxy_factory, tmp_path):
    proxy = proxy_factory(config(tmp_path, vllm_pair))
    proxy.chat([{"role": "user", "content": "Count the points. " + LONG}])

    def reported() -> bool:
        points = proxy.client.get("/v1/stats").json().get("points") or []
        return any(
            v.get("engine") == "vllm" and (v.get("prompt_tokens") or 0) > 0
            for p in points
            for v in (p.get("replicas") or {}).values()
        )

    assert wait_until(reported, 10)
    assert "kvgate_replica_engine_prompt_tokens_total" in proxy.client.get("/metrics").text


def test_prefill_time_reads_the_engines_and_keeps_a_conversation(vllm_pair, proxy_factory, tmp_path):
    """policy prefill_time: the proxy's one reader of the engines' /metrics (every 0.2 s here)
    calibrates each vLLM's prefill rate from its own counters, and turn 2 still goes where turn 1's
    history is, its cached tokens the ones the router expected."""
    proxy = proxy_factory(config(tmp_path, vllm_pair, policy="prefill_time", engine_poll_s=0.2))
    turn1 = [{"role": "user", "content": "Describe the town for a visitor. " + LONG}]
    r1, u1 = proxy.chat(turn1, tenant="timed")
    assert r1.status_code == 200, r1.text
    first = r1.headers["x-kvgate-replica"]

    def calibrated() -> bool:
        return bool((proxy.router.stats()[first].get("engine_load") or {}).get("prefill_tokens_per_s"))

    assert wait_until(calibrated, 15)  # vLLM counts a request's prefill when it finishes
    load = proxy.router.stats()[first]["engine_load"]
    assert load["prefill_tokens_per_s"] > 0 and load["waiting"] == 0 and load["prefill_tokens_per_request"] > 0
    assert wait_until(lambda: proxy.router.index.blocks(first) >= u1["prompt_tokens"] // 128, 10)
    answer = r1.json()["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": answer}, {"role": "user", "content": "And its market?"}]
    r2, u2 = proxy.chat(turn2, tenant="timed")
    assert r2.headers["x-kvgate-replica"] == first  # both idle: the history decides
    assert cached(u2) == int(r2.headers["x-kvgate-expected-cached-tokens"]) > 0


def test_kill_9_of_a_vllm_server_under_load(vllm_pair, proxy_factory, tmp_path):
    proxy = proxy_factory(config(tmp_path, vllm_pair, down_for_s=30))
    for i in range(4):  # both replicas hold blocks
        proxy.chat([{"role": "user", "content": f"Warm {i}. " + LONG}], tenant=f"t{i}")
    assert wait_until(lambda: all(proxy.router.index.blocks(n) > 0 for n in ("v1", "v2")), 15)
    victim = vllm_pair[1]

    def one(i: int) -> int:
        r, _ = proxy.chat([{"role": "user", "content": f"Load {i}: " + LONG[: 400 + 10 * i]}], tenant=f"t{i % 4}")
        return r.status_code

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(one, i) for i in range(16)]
        wait_until(lambda: sum(f.done() for f in futures) >= 2, 60)
        victim.kill(signal.SIGKILL)
        codes = [f.result() for f in futures]
    assert codes == [200] * 16  # failover: no client error
    assert wait_until(lambda: proxy.router.index.blocks("v2") == 0, 15)  # its blocks left the index
    victim.start().wait_ready(300)  # restarted (same ports): an empty cache, events from seq 0
    assert wait_until(lambda: proxy.router.replicas[1].healthy, 40)
    for i in range(4):
        proxy.chat([{"role": "user", "content": f"After {i}. " + LONG}], tenant=f"t{i}")
    assert wait_until(lambda: proxy.router.index.blocks("v2") > 0, 20)
