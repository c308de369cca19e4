"""Shared fixtures: one real embedder per session, fake backends and proxies on 127.0.0.1."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
import pytest

import kvgate.middleware  # noqa: F401
from kvgate.engines.demo import Calls, create_fake_app
from kvgate.index.responses.embedder import Embedder, make_embedder
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import Config, parse_config
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread

ROOT = Path(__file__).resolve().parents[1]


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll `cond` every 10 ms until it holds or `timeout` s pass; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return make_embedder("onnx")


class Backend:
    def __init__(self) -> None:
        self.calls = Calls()
        self.server = ServerThread(create_fake_app(self.calls)).start()
        self.url = self.server.url
        self.api_base = f"{self.url}/v1"

    @property
    def count(self) -> int:
        return self.calls.count


@pytest.fixture(scope="session")
def backend() -> Iterator[Backend]:
    b = Backend()
    yield b
    b.server.stop()


class ServedProxy:
    """A fake replica (kvgate.engines.demo) with the real proxy and pipeline in front of it, each
    in a thread; `config_of(replica_api_base)` is the proxy's config as a dict."""

    def __init__(self, config_of: Callable[[str], dict[str, Any]]) -> None:
        self.calls = Calls()
        self.replica = ServerThread(create_fake_app(self.calls)).start()
        config = parse_config(config_of(f"{self.replica.url}/v1"))
        self.pipeline = build_pipeline(config)
        self.proxy = ServerThread(create_app(config, self.pipeline)).start()
        self.http = httpx.Client(base_url=self.proxy.url, timeout=60)

    def stop(self) -> None:
        self.http.close()
        self.proxy.stop()
        self.pipeline.close()
        self.replica.stop()


def route_config(api_base: str, cache_dir: Path, **semantic: Any) -> dict[str, Any]:
    """The issue's example config, pointed at a test backend. `ttl` is the route's; the other
    keywords go into its `semantic:` block."""
    ttl = semantic.pop("ttl", 86400)
    return {
        "cache_dir": str(cache_dir),
        "routes": [
            {
                "name": "chat",
                "model": "demo-*",
                "ttl": ttl,
                "scope": "tenant",
                "backend": {"model": "openai/served-name", "api_base": api_base, "api_key": "sk-x"},
                "semantic": {"threshold": 0.9, "context": "exact", **semantic},
            },
            {
                "name": "shared",
                "model": "shared-*",
                "scope": "shared",
                "backend": {"model": "openai/served-name", "api_base": api_base, "api_key": "sk-x"},
                "semantic": {"threshold": 0.9},
            },
        ],
    }


class Proxy:
    def __init__(self, config: Config, embedder: Embedder) -> None:
        self.pipeline = build_pipeline(config, embedder=embedder)
        self.server = ServerThread(create_app(config, self.pipeline)).start()
        self.url = self.server.url
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def chat(
        self,
        content: str | list[dict[str, Any]],
        *,
        key: str = "key-a",
        model: str = "demo-1",
        headers: dict[str, str] | None = None,
        **params: Any,
    ) -> httpx.Response:
        messages = content if isinstance(content, list) else [{"role": "user", "content": content}]
        body = {"model": model, "messages": messages, **params}
        return self.http.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}", **(headers or {})}
        )

    def stop(self) -> None:
        self.http.close()
        self.server.stop()
        self.pipeline.close()


@pytest.fixture
def make_proxy(embedder: Embedder, backend: Backend, tmp_path: Path) -> Iterator[Callable[..., Proxy]]:
    started: list[Proxy] = []

    def make(cache_dir: Path | None = None, raw: dict[str, Any] | None = None, **semantic: Any) -> Proxy:
        config = parse_config(raw or route_config(backend.api_base, cache_dir or tmp_path / "cache", **semantic))
        proxy = Proxy(config, embedder)
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        if proxy.server.thread.is_alive():
            proxy.stop()


@pytest.fixture()
def redis_server() -> Iterator[Any]:
    """A real redis-server on a free loopback port, killed after the test."""
    from kvgate.tools.redis_proc import RedisServer

    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def vllm_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    """Two real vLLM servers (SmolLM2, one core each, prefix caching, KV events with a replay
    socket, cached-token details), started once for the whole test session, on 127.0.0.1. Both
    load kvgate's KV connector over one shared disk tier (`servers[0].kv_connector`), raw chunks,
    so a load gives bit-exact KV and tests can compare outputs exactly. In float32 on every host:
    where vLLM's CPU build would run bfloat16 (a host with native bfloat16), the engine that loaded
    a history and the one that had it cached once answered alike for six greedy tokens and then
    apart; float32 is the precision the exact comparisons were made in."""
    from kvgate.engines.vllm.launch import default_model_dir, start_pair, tier_settings, vllm_available, vllm_python

    if not vllm_available():
        pytest.fail(f"vLLM's environment is missing ({vllm_python()}): run `make install`")
    logs = tmp_path_factory.mktemp("vllm")
    tier = tier_settings(logs / "kv-tier", codec="raw", memory_mb=64, disk_mb=2048)
    servers = start_pair(str(default_model_dir()), log_dir=logs, timeout=300, kv_connector=tier, dtype="float32")
    yield servers
    for server in servers:
        server.stop()


def one_replica_config(
    cache_dir: Path, replica_url: str, *, semantic: dict[str, Any] | None = None, routing: dict[str, Any] | None = None
) -> Config:
    """Route `r` (models smol*) on one OpenAI-compatible replica, the semantic tier off unless given."""
    return parse_config(
        {
            "cache_dir": str(cache_dir),
            "routes": [
                {
                    "name": "r",
                    "model": "smol*",
                    "backend": {"model": "openai/smollm2", "api_key": "none"},
                    "semantic": semantic or {"enabled": False},
                    "replicas": [{"name": "r0", "api_base": f"{replica_url}/v1"}],
                    "routing": routing or {},
                }
            ],
        }
    )
