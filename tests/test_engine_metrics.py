"""middleware/telemetry/engine_metrics.py on real exposition text: vLLM's (as vLLM 0.32 serves it) and the
reference replica's (made by engines/replica/metrics.py itself, so a rename there fails here),
and the /metrics collector that re-exports the readings per {route,replica}."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.engines.replica.metrics import ReplicaMetrics
from kvgate.middleware.telemetry.engine_metrics import KVGATE, VLLM, ReplicaReading, engine_of, replica_reading
from kvgate.middleware.telemetry.metrics import Metrics
from kvgate.middleware.telemetry.replica_scrape import parse_metrics

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="smollm2"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="smollm2"} 2.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="smollm2"} 1022.0
vllm:prompt_tokens_created{engine="0",model_name="smollm2"} 1.7957118784560091e+09
# TYPE vllm:prompt_tokens_cached_total counter
vllm:prompt_tokens_cached_total{engine="0",model_name="smollm2"} 384.0
# TYPE vllm:external_prefix_cache_hits_total counter
vllm:external_prefix_cache_hits_total{engine="0",model_name="smollm2"} 0.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="smollm2"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="smollm2"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="smollm2"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="smollm2"} 0.52
"""


def vllm_text(
    prompt: float = 1022,
    cached: float = 384,
    external: float = 0,
    running: float = 1,
    waiting: float = 2,
    engines: tuple[str, ...] = ("0",),
) -> str:
    """vLLM's names and labels with chosen values (each engine core reports the same here)."""
    lines = []
    for name, kind, value in (
        ("vllm:num_requests_running", "gauge", running),
        ("vllm:num_requests_waiting", "gauge", waiting),
        ("vllm:prompt_tokens_total", "counter", prompt),
        ("vllm:prompt_tokens_cached_total", "counter", cached),
        ("vllm:external_prefix_cache_hits_total", "counter", external),
    ):
        lines.append(f"# TYPE {name} {kind}")
        lines += [f'{name}{{engine="{e}",model_name="smollm2"}} {float(value)}' for e in engines]
    return "\n".join(lines) + "\n"


class QueueOf:
    """The two `stats` views ReplicaMetrics reads from an engine: queue length, and no KV store."""

    def __init__(self, waiting: int) -> None:
        self.waiting = waiting

    def stats(self, store: bool = True) -> dict[str, Any]:
        return {"queue_len": self.waiting}


def test_vllm_exposition_reads_tokens_and_queues() -> None:
    samples = parse_metrics(VLLM_TEXT)
    assert samples is not None and engine_of(samples) is VLLM
    assert replica_reading(samples) == ReplicaReading(
        "vllm", prompt_tokens=1022.0, cached_tokens=384.0, external_cached_tokens=0.0, running=1.0, waiting=2.0
    )


def test_vllm_label_sets_are_summed() -> None:
    """Data-parallel vLLM: one label set per engine core, the replica's numbers are their sum."""
    reading = replica_reading(parse_metrics(vllm_text(100, 40, 8, 1, 3, engines=("0", "1"))) or {})
    assert reading == ReplicaReading("vllm", 200.0, 80.0, 16.0, 2.0, 6.0)


def test_reference_replica_exposition_reads_its_own_names() -> None:
    metrics = ReplicaMetrics(QueueOf(waiting=3))  # type: ignore[arg-type]
    metrics.prompt_tokens.inc(100)
    metrics.cached_tokens.inc(40)
    samples = parse_metrics(generate_latest(metrics.registry).decode())
    assert samples is not None and engine_of(samples) is KVGATE
    # no running gauge and no separate external count on the reference replica: None, not 0
    assert replica_reading(samples) == ReplicaReading(
        "kvgate", prompt_tokens=100.0, cached_tokens=40.0, external_cached_tokens=None, running=None, waiting=3.0
    )


def test_unknown_or_partial_expositions() -> None:
    assert replica_reading({}) is None
    assert replica_reading(parse_metrics("# TYPE up gauge\nup 1\n") or {}) is None
    # a vLLM that lacks a metric (an older version): that number is unknown, not zero
    only_prompt = parse_metrics('# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{engine="0"} 5\n')
    assert replica_reading(only_prompt or {}) == ReplicaReading("vllm", 5.0, None, None, None, None)


def test_since_gives_counter_growth_and_current_gauges() -> None:
    before = ReplicaReading("vllm", 100.0, 40.0, 0.0, 1.0, 2.0)
    now = ReplicaReading("vllm", 160.0, 70.0, 4.0, 0.0, 5.0)
    assert now.since(before) == ReplicaReading("vllm", 60.0, 30.0, 4.0, 0.0, 5.0)
    assert now.since(None) == now  # the first reading: everything since the engine started
    restarted = ReplicaReading("vllm", 10.0, 0.0, 0.0, 0.0, 0.0)
    assert restarted.since(now).prompt_tokens == 10.0  # a counter that went back counts from zero
    other = ReplicaReading("kvgate", 50.0, 20.0, None, None, 1.0)
    assert other.since(now) == other  # another engine behind the same address: from zero
    partial = ReplicaReading("kvgate", 50.0, 20.0, None, None, 1.0)
    assert partial.since(ReplicaReading("kvgate", 30.0, 5.0, None, None, 0.0)).external_cached_tokens is None


def scrape(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(metrics.render().decode())
        for s in fam.samples
    }


def test_collector_exports_the_last_readings_per_route_and_replica() -> None:
    metrics = Metrics()
    readings = {
        ("local", "v"): ReplicaReading("vllm", 1022.0, 384.0, 0.0, 1.0, 2.0),
        ("local", "k"): ReplicaReading("kvgate", 100.0, 40.0, None, None, 3.0),
    }
    metrics.watch_engines(lambda: readings)
    got = scrape(metrics)
    v, k = (("replica", "v"), ("route", "local")), (("replica", "k"), ("route", "local"))
    assert got[("kvgate_replica_engine_prompt_tokens_total", v)] == 1022
    assert got[("kvgate_replica_engine_cached_tokens_total", v)] == 384
    assert got[("kvgate_replica_engine_external_cached_tokens_total", v)] == 0
    assert got[("kvgate_replica_engine_running", v)] == 1 and got[("kvgate_replica_engine_waiting", v)] == 2
    assert got[("kvgate_replica_engine_info", (("engine", "vllm"), *v))] == 1
    assert got[("kvgate_replica_engine_prompt_tokens_total", k)] == 100
    assert got[("kvgate_replica_engine_waiting", k)] == 3
    assert ("kvgate_replica_engine_running", k) not in got  # its engine has no such gauge: no sample
    assert ("kvgate_replica_engine_external_cached_tokens_total", k) not in got
    # a reused pipeline's second app repoints the collector instead of registering the names twice
    metrics.watch_engines(lambda: {})
    assert not any(name.startswith("kvgate_replica_engine_") for name, _ in scrape(metrics))
