"""examples/grafana/kvgate-dashboard.json queries only metrics that exist: after real traffic
through a proxy (a priced route on the demo backend; a routed one over a real reference replica
and a dead one, so a failover happens) every kvgate_* name in its PromQL is on the proxy's or the
replica's /metrics. The same setup checks that /v1/stats carries the replica's own KV readings."""

from __future__ import annotations

import json
import re
import socket
import time
from typing import Any, Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.engines.replica.engine import ReplicaEngine
from kvgate.engines.replica.model import load_model, model_namespace
from kvgate.engines.replica.server import build_store, create_replica_app
from kvgate.middleware.config import parse_config
from kvgate.tools.bench.procs import ServerThread
from tests.conftest import ROOT, Proxy

pytestmark = pytest.mark.slow  # loads the real SmolLM2 replica
DASHBOARD = ROOT / "examples" / "grafana" / "kvgate-dashboard.json"
METRIC = re.compile(r"\bkvgate_[a-zA-Z0-9_:]*")
LONG = " ".join(f"Fact {i}: {i} squared is {i * i}." for i in range(18))  # a little over one 256-token chunk


def queried_metrics(dashboard: dict[str, Any]) -> set[str]:
    """Every kvgate_* metric name in the dashboard's PromQL (panel targets and template queries)."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [json.dumps(v.get("query")) for v in dashboard["templating"]["list"]]
    return {name for expr in exprs for name in METRIC.findall(expr)}


def sample_names(text: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    model, tokenizer = load_model("smollm2")
    store = build_store(tmp_path_factory.mktemp("kv"), 64, 128, model_namespace(model))
    engine = ReplicaEngine(model, tokenizer, store, chunk_tokens=256)
    server = ServerThread(create_replica_app(engine, "r1")).start()
    yield server
    server.stop()
    engine.close()
    store.close()


@pytest.fixture(scope="module")
def traffic(
    replica: ServerThread, backend: Any, embedder: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Proxy, str]]:
    raw = {
        "cache_dir": str(tmp_path_factory.mktemp("cache")),
        "stats": {"interval_s": 0.2},
        "routes": [
            {
                "name": "priced",
                "model": "gpt-*",
                "semantic": {"enabled": False},
                "backend": {"model": "openai/gpt-4o-mini", "api_base": backend.api_base, "api_key": "sk-x"},
            },
            {
                "name": "local",
                "model": "smol*",
                "semantic": {"enabled": False},
                "backend": {"model": "openai/smollm2", "api_key": "none"},
                "replicas": [
                    {"name": "dead", "api_base": f"http://127.0.0.1:{free_port()}/v1"},
                    {"name": "r1", "api_base": f"{replica.url}/v1"},
                ],
                "routing": {"policy": "round_robin", "probe_interval_s": 60, "down_for_s": 60},
            },
        ],
    }
    proxy = Proxy(parse_config(raw), embedder)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    assert proxy.chat(question, model="gpt-4o-mini").headers["x-kvgate-cache"] == "miss"
    hit = proxy.chat(question, model="gpt-4o-mini")
    assert hit.headers["x-kvgate-cache"] == "exact"
    assert proxy.chat("Stream this one", model="gpt-4o-mini", stream=True).status_code == 200
    verdict = proxy.http.post(
        "/v1/cache/feedback",
        json={"request_id": hit.headers["x-kvgate-request-id"], "correct": False},
        headers={"authorization": "Bearer key-a"},
    )
    assert verdict.status_code == 200
    long_chat = [{"role": "user", "content": f"{LONG}\nWhat is 7 squared?"}]
    for _ in range(2):  # the first goes to the dead replica and fails over; the second reuses its chunk
        routed = proxy.chat(long_chat, model="smollm2", max_tokens=1, headers={"x-kvgate-cache-control": "no-cache"})
        assert routed.status_code == 200 and routed.headers["x-kvgate-replica"] == "r1"
    yield proxy, replica.url
    proxy.stop()


def test_every_metric_the_grafana_dashboard_queries_exists(traffic: tuple[Proxy, str]) -> None:
    proxy, replica_url = traffic
    dashboard = json.loads(DASHBOARD.read_text())
    queried = queried_metrics(dashboard)
    assert len(queried) >= 20  # the parse found the queries
    exported = sample_names(proxy.http.get("/metrics").text) | sample_names(httpx.get(f"{replica_url}/metrics").text)
    assert sorted(queried - exported) == []


def test_stats_carry_the_replicas_own_kv_readings(traffic: tuple[Proxy, str]) -> None:
    proxy, _ = traffic
    deadline = time.monotonic() + 10
    while True:
        stats = proxy.http.get("/v1/stats").json()
        points = stats["points"]
        prompt = sum(p["replicas"]["local/r1"].get("prompt_tokens", 0) for p in points)
        cached = sum(p["replicas"]["local/r1"].get("cached_tokens", 0) for p in points)
        if cached > 0 or time.monotonic() > deadline:  # the second request's readings are in
            break
        time.sleep(0.1)
    assert prompt > 256 and 256 <= cached < prompt  # the second long prompt reused its first chunk
    last = points[-1]["replicas"]
    assert set(last["local/r1"]["kv_bytes"]) == {"memory", "disk"} and last["local/r1"]["kv_bytes"]["memory"] > 0
    assert sum(p["replicas"]["local/r1"].get("kv_hits", {}).get("memory", 0) for p in points) >= 1
    assert last["local/dead"]["scraped"] is False and last["local/dead"]["up"] == 0
    assert sum(p["routes"]["local"]["failovers"] for p in points) == 1
    assert stats["totals"]["priced"]["wrong"] == 1 and stats["totals"]["priced"]["cost_saved"] > 0
