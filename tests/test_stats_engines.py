"""Per-replica engine numbers end to end through a real proxy: one fake replica serves vLLM's
exposition on /metrics, another the reference replica's (made by engines/replica/metrics.py), and
/v1/stats and the proxy's /metrics show each one's prompt / cached tokens and running / waiting
requests. (A live vLLM server is checked apart from this.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from fastapi.responses import Response
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.engines.demo import create_fake_app
from kvgate.engines.replica.metrics import ReplicaMetrics
from kvgate.middleware.config import parse_config
from kvgate.tools.bench.procs import ServerThread
from tests.conftest import Proxy
from tests.test_engine_metrics import QueueOf, vllm_text

KEY = "key-engines"
AUTH = {"authorization": f"Bearer {KEY}"}


class Replicas:
    """Two fake replicas: `vllm` serves `self.vllm` as its /metrics, `ref` a reference replica's registry."""

    def __init__(self) -> None:
        self.vllm = vllm_text(prompt=1022, cached=384, external=0, running=1, waiting=2)
        self.ref = ReplicaMetrics(QueueOf(waiting=3))  # type: ignore[arg-type]
        self.ref.prompt_tokens.inc(100)
        self.ref.cached_tokens.inc(40)
        vllm_app, ref_app = create_fake_app(), create_fake_app()
        vllm_app.add_api_route("/metrics", lambda: Response(self.vllm, media_type="text/plain"), methods=["GET"])
        ref_app.add_api_route("/metrics", lambda: Response(generate_latest(self.ref.registry)), methods=["GET"])
        self.servers = {"v": ServerThread(vllm_app).start(), "k": ServerThread(ref_app).start()}


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[Proxy, Replicas]]:
    replicas = Replicas()
    raw = {
        "cache_dir": str(tmp_path / "cache"),
        "auth": {"keys": [KEY]},
        "stats": {"interval_s": 0.2, "keep": 100},
        "routes": [
            {
                "name": "local",
                "model": "demo-*",
                "semantic": {"enabled": False},
                "backend": {"model": "openai/served", "api_key": "sk-x"},
                "replicas": [{"name": n, "api_base": f"{s.url}/v1"} for n, s in replicas.servers.items()],
                "routing": {"policy": "round_robin"},
            }
        ],
    }
    started = Proxy(parse_config(raw), None)  # type: ignore[arg-type]  # no semantic route: no embedder
    yield started, replicas
    started.stop()
    for server in replicas.servers.values():
        server.stop()


def stats_when(proxy: Proxy, ready: Callable[[dict[str, Any]], bool], timeout: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        stats = proxy.http.get("/v1/stats", headers=AUTH).json()
        if stats["points"] and ready(stats):
            return stats
        assert time.monotonic() < deadline, f"/v1/stats never got there: {stats['points'][-1:]}"
        time.sleep(0.1)


def proxy_metrics(proxy: Proxy) -> dict[tuple[str, str], float]:
    """The proxy's kvgate_replica_engine_* samples: {(sample name, replica): value}."""
    resp = proxy.http.get("/metrics", headers=AUTH)
    assert resp.status_code == 200
    return {
        (s.name, s.labels["replica"]): s.value
        for fam in text_string_to_metric_families(resp.text)
        for s in fam.samples
        if s.name.startswith("kvgate_replica_engine_") and s.labels.get("route") == "local"
    }


def test_vllm_and_reference_replicas_show_their_engine_numbers(proxy: tuple[Proxy, Replicas]) -> None:
    server, replicas = proxy
    first = stats_when(
        server,
        lambda s: (
            s["points"][-1]["replicas"]["local/v"].get("engine") == "vllm"
            and s["points"][-1]["replicas"]["local/k"].get("engine") == "kvgate"
        ),
    )
    last = first["points"][-1]["replicas"]
    assert last["local/v"]["running"] == 1 and last["local/v"]["waiting"] == 2
    assert last["local/k"]["running"] is None and last["local/k"]["waiting"] == 3
    assert last["local/k"]["external_cached_tokens"] is None

    # the engines serve more; each point carries its interval's growth, so the points add up to the counters
    replicas.vllm = vllm_text(prompt=1500, cached=600, external=50, running=0, waiting=4)
    replicas.ref.prompt_tokens.inc(20)
    replicas.ref.cached_tokens.inc(10)
    stats = stats_when(
        server,
        lambda s: (
            s["points"][-1]["replicas"]["local/v"]["waiting"] == 4
            and s["points"][-1]["replicas"]["local/k"]["engine"] == "kvgate"
            and sum(p["replicas"]["local/k"]["prompt_tokens"] for p in s["points"]) == 120
        ),
    )
    points = stats["points"]

    def added(replica: str, field: str) -> float:
        return sum(p["replicas"][f"local/{replica}"][field] or 0 for p in points)

    assert (added("v", "prompt_tokens"), added("v", "cached_tokens"), added("v", "external_cached_tokens")) == (
        1500,
        600,
        50,
    )
    assert (added("k", "prompt_tokens"), added("k", "cached_tokens")) == (120, 40 + 10)
    last = points[-1]["replicas"]
    assert last["local/v"]["running"] == 0 and last["local/v"]["scraped"] is True
    # the fields the dashboard read before are all still there
    assert {"requests", "marked_down", "in_flight", "up", "scraped", "kv_bytes", "kv_hits"} <= set(last["local/v"])

    got = proxy_metrics(server)
    assert got[("kvgate_replica_engine_prompt_tokens_total", "v")] == 1500
    assert got[("kvgate_replica_engine_cached_tokens_total", "v")] == 600
    assert got[("kvgate_replica_engine_external_cached_tokens_total", "v")] == 50
    assert got[("kvgate_replica_engine_running", "v")] == 0 and got[("kvgate_replica_engine_waiting", "v")] == 4
    assert got[("kvgate_replica_engine_info", "v")] == 1
    assert got[("kvgate_replica_engine_prompt_tokens_total", "k")] == 120
    assert got[("kvgate_replica_engine_cached_tokens_total", "k")] == 50
    assert got[("kvgate_replica_engine_waiting", "k")] == 3
    assert ("kvgate_replica_engine_running", "k") not in got  # the reference replica exports no such gauge

    # a replica that stops answering drops out of /metrics instead of showing stale numbers
    replicas.servers["v"].stop()
    deadline = time.monotonic() + 15
    while ("kvgate_replica_engine_prompt_tokens_total", "v") in proxy_metrics(server):
        assert time.monotonic() < deadline, "a dead replica's engine numbers stayed on /metrics"
        time.sleep(0.1)
    assert ("kvgate_replica_engine_prompt_tokens_total", "k") in proxy_metrics(server)
