"""/v1/stats: the quantile and growth helpers, and the ring end to end through a real proxy whose
route has two replicas (demo backends; one also serves a replica-style /metrics)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kvgate.engines.demo import create_fake_app
from kvgate.middleware.config import ReplicaConfig, RoutingConfig, parse_config
from kvgate.middleware.routing.router import Router
from kvgate.middleware.server.ui import read_scrape
from kvgate.middleware.telemetry.metrics import Metrics
from kvgate.middleware.telemetry.replica_scrape import metrics_url, parse_metrics
from kvgate.middleware.telemetry.stats import Scrape, StatsRecorder
from kvgate.middleware.telemetry.stats_samples import flatten, growth, quantile
from kvgate.tools.bench.procs import ServerThread
from tests.conftest import Proxy

KEY = "key-stats"


def test_quantile_interpolates_inside_the_bucket_like_prometheus() -> None:
    cumulative = [(0.1, 0.0), (0.2, 10.0), (0.5, 10.0), (math.inf, 10.0)]
    assert quantile(cumulative, 0.5) == pytest.approx(0.15)  # rank 5 of 10, all in (0.1, 0.2]
    assert quantile(cumulative, 1.0) == pytest.approx(0.2)
    assert quantile([(0.1, 0.0), (math.inf, 4.0)], 0.5) == 0.1  # only +Inf: its lower bound
    assert quantile([(0.1, 0.0), (math.inf, 0.0)], 0.5) is None
    assert quantile([], 0.99) is None


def test_growth_counts_a_reset_counter_from_zero_and_ignores_gauges() -> None:
    before = {("x_total", ()): 10.0, ("g", ()): 5.0}
    after = {("x_total", ()): 3.0, ("g", ()): 7.0, ("y_bucket", (("le", "1"),)): 2.0}
    assert growth(before, after) == {("x_total", ()): 3.0, ("y_bucket", (("le", "1"),)): 2.0}


def test_metrics_url_and_unparsable_text() -> None:
    assert metrics_url("http://127.0.0.1:9101/v1/") == "http://127.0.0.1:9101/metrics"
    assert metrics_url("http://h:1") == "http://h:1/metrics"
    assert parse_metrics("not { prometheus") is None and parse_metrics(None) is None


class ReplicaCounters:
    """What a kvgate replica exports that the dashboard reads (engines/replica/metrics.py names)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.prompt = Counter("kvgate_replica_prompt_tokens", "", registry=r)
        self.cached = Counter("kvgate_replica_cached_tokens", "", registry=r)
        self.hits = Counter("kvgate_replica_kv_chunk_hits", "", ["tier"], registry=r)
        self.bytes = Gauge("kvgate_replica_kv_bytes", "", ["tier"], registry=r)


@pytest.fixture
def replicas() -> Iterator[tuple[dict[str, ServerThread], ReplicaCounters]]:
    counters = ReplicaCounters()
    with_metrics = create_fake_app()
    with_metrics.add_api_route("/metrics", lambda: Response(generate_latest(counters.registry)), methods=["GET"])
    servers = {"r1": ServerThread(with_metrics).start(), "r2": ServerThread(create_fake_app()).start()}
    yield servers, counters
    for server in servers.values():
        server.stop()


def wait_for_point(proxy: Proxy, ready: Any, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        stats = proxy.http.get("/v1/stats", headers={"authorization": f"Bearer {KEY}"}).json()
        if ready(stats) or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


def test_stats_follow_traffic_per_route_and_replica(embedder: Any, tmp_path: Path, replicas: Any) -> None:
    servers, counters = replicas
    raw = {
        "cache_dir": str(tmp_path / "cache"),
        "auth": {"keys": [KEY]},
        "stats": {"interval_s": 0.2, "keep": 50},
        "routes": [
            {
                "name": "local",
                "model": "demo-*",
                "semantic": {"enabled": False},
                "backend": {"model": "openai/served", "api_key": "sk-x"},
                "replicas": [{"name": n, "api_base": f"{s.url}/v1"} for n, s in servers.items()],
                "routing": {"policy": "round_robin"},
            }
        ],
    }
    proxy = Proxy(parse_config(raw), embedder)
    try:
        secret = "What is my secret project codename?"
        for i in range(4):
            assert proxy.chat(f"{secret} {i}", key=KEY).headers["x-kvgate-cache"] == "miss"
        assert proxy.chat(f"{secret} 0", key=KEY).headers["x-kvgate-cache"] == "exact"
        counters.prompt.inc(100)
        counters.cached.inc(75)
        counters.hits.labels("memory").inc(3)
        counters.bytes.labels("disk").set(4096)
        counters.bytes.labels("memory").set(2048)
        stats = wait_for_point(
            proxy,
            lambda s: (
                s["totals"].get("local", {}).get("exact") == 1
                and len(s["points"]) >= 2
                and s["points"][-1]["replicas"]["local/r1"].get("kv_bytes")
            ),
        )
        assert stats["totals"]["local"]["miss"] == 4 and stats["totals"]["local"]["exact"] == 1
        points = stats["points"]
        assert sum(p["routes"]["local"]["miss"] for p in points) == 4
        assert sum(p["routes"]["local"]["exact"] for p in points) == 1
        sent = {r: sum(p["replicas"][f"local/{r}"]["requests"] for p in points) for r in ("r1", "r2")}
        assert sent == {"r1": 2, "r2": 2}  # round robin
        last = points[-1]["replicas"]
        assert last["local/r1"]["up"] == 1 and last["local/r2"]["scraped"] is False
        assert sum(p["replicas"]["local/r1"].get("prompt_tokens", 0) for p in points) == 100
        assert sum(p["replicas"]["local/r1"].get("cached_tokens", 0) for p in points) == 75
        assert last["local/r1"]["kv_bytes"] == {"disk": 4096, "memory": 2048}
        assert any(p["routes"]["local"]["miss_p50"] is not None for p in points)
        assert secret not in json.dumps(stats) and KEY not in json.dumps(stats)
        later = proxy.http.get(
            "/v1/stats", params={"since": points[-2]["t"]}, headers={"authorization": f"Bearer {KEY}"}
        ).json()["points"]
        assert [p["t"] for p in later][:1] == [points[-1]["t"]]
        bad = proxy.http.get("/v1/stats?since=yesterday", headers={"authorization": f"Bearer {KEY}"})
        assert bad.status_code == 400 and bad.json()["error"]["param"].endswith("since")
        assert proxy.http.get("/v1/stats").status_code == 401
        # the browser's Basic credentials open the dashboard's GETs only, never the API
        assert proxy.http.get("/v1/stats", auth=("ops", KEY)).status_code == 200
        assert proxy.http.get("/v1/stats", auth=("ops", "wrong")).status_code == 401
        body = {"model": "demo-1", "messages": [{"role": "user", "content": "hi"}]}
        assert proxy.http.post("/v1/chat/completions", auth=("ops", KEY), json=body).status_code == 401
        assert proxy.http.get("/v1/models", auth=("ops", KEY)).status_code == 401
    finally:
        proxy.stop()


class Counting(Collector):
    """A scrape-time family the dashboard does not read, counting its collections."""

    def __init__(self) -> None:
        self.collected = 0

    def describe(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily("kvgate_not_on_the_dashboard", "")]

    def collect(self) -> list[GaugeMetricFamily]:
        self.collected += 1
        return [GaugeMetricFamily("kvgate_not_on_the_dashboard", "", value=1.0)]


def test_the_tick_collects_only_what_a_point_reads_and_makes_the_same_points() -> None:
    reps = [ReplicaConfig(name=n, api_base=f"http://{n}/v1") for n in ("a", "b")]
    router = Router(reps, RoutingConfig(policy="round_robin"))
    metrics = Metrics()
    metrics.watch({"r": router}, {})
    for replica in router.replicas:
        metrics.watch_replica("r", replica)
    other = Counting()
    metrics.registry.register(other)
    recorders = {name: StatsRecorder(["r"], [("r", "a"), ("r", "b")], 1.0, 10) for name in ("full", "tick")}
    messages = [{"role": "user", "content": "a prompt long enough to fill a few blocks " * 4}]
    for step in range(3):
        for _ in range(step + 1):
            ticket = router.started(router.replicas[step % 2], router.plan(messages))
            router.finished(ticket, ok=step != 1)
        metrics.requests.labels("r", "miss").inc()
        metrics.requests.labels("r", "exact").inc(step)
        metrics.backend_calls.labels("r", "error").inc()
        metrics.tokens_saved.labels("r").inc(10 * step)
        metrics.cost_saved.labels("r").inc(0.5)
        metrics.feedback.labels("r", "exact", "wrong").inc()
        metrics.explorations.labels("r").inc()
        metrics.served_wrong_estimate.labels("r").inc(0.25)
        metrics.failovers.labels("r", "mid_stream").inc()
        metrics.latency.labels("r", "miss").observe(0.02 * (step + 1))
        metrics.latency.labels("r", "exact").observe(0.001)
        metrics.ttft.labels("r", "miss").observe(0.3)
        if step == 2:
            router.mark_down(router.replicas[1], "test")
        full = recorders["full"].advance(Scrape(float(step), flatten(metrics.registry.collect())))
        collected = other.collected
        tick = recorders["tick"].advance(read_scrape(metrics.registry, {}, float(step)))
        assert other.collected == collected  # the tick left the family it does not read alone
        assert tick == full
    assert tick["routes"]["r"]["error"] == 1 and tick["routes"]["r"]["hit_p50"] is not None
    assert tick["replicas"]["r/b"]["up"] == 0 and tick["replicas"]["r/a"]["requests"] == 3
    assert recorders["tick"].view()["totals"] == recorders["full"].view()["totals"]
