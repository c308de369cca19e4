"""What each kind of engine calls the per-replica numbers the proxy shows and routes on: prompt
tokens, cached prompt tokens, requests running and waiting, and the prefill work and time behind
an engine's measured prefill rate (kvgate.middleware.routing.engine_load).

A replica's own /metrics is read as it is (middleware/telemetry/replica_scrape.py); the names differ per
engine kind, so they live here, one table per kind, and nothing else in the proxy knows them. To
read another engine, add its table to ENGINES.

Invariants: `replica_reading` is pure (the same samples give the same reading); a number is None
exactly where the engine kind exports no such metric or the scrape lacked it, never a made-up 0;
samples of one name are summed over their label sets (vLLM labels every sample with `engine` and
`model_name`, one set per engine core and served model).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from kvgate.middleware.telemetry.stats_samples import Key, gained

# only grow (reset on restart)
COUNTERS = (
    "prompt_tokens",
    "cached_tokens",
    "external_cached_tokens",
    "prefill_tokens",
    "prefill_seconds",
    "prefill_requests",
)
GAUGES = ("running", "waiting")  # current state


@dataclass(frozen=True)
class EngineNames:
    """One engine kind's sample names, as exposed (counters with `_total`); None: not exported."""

    kind: str
    prompt_tokens: str  # counter: prompt tokens received
    cached_tokens: str  # counter: prompt tokens whose KV was reused (every tier: local and external)
    external_cached_tokens: str | None = None  # counter: the part of cached_tokens from outside the engine
    running: str | None = None  # gauge: requests the engine is computing
    waiting: str | None = None  # gauge: requests queued for the engine
    prefill_tokens: str | None = None  # counter: tokens computed in prefill (cached ones excluded)
    prefill_seconds: str | None = None  # counter: seconds requests spent in prefill
    prefill_requests: str | None = None  # counter: requests whose prefill the two above cover

    def names(self) -> frozenset[str]:
        return frozenset(name for f in fields(self) if f.name != "kind" and (name := getattr(self, f.name)))


VLLM = EngineNames(
    "vllm",
    prompt_tokens="vllm:prompt_tokens_total",
    cached_tokens="vllm:prompt_tokens_cached_total",  # local prefix-cache hits plus connector (external) hits
    external_cached_tokens="vllm:external_prefix_cache_hits_total",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    # histograms observed as a request finishes: their _sum and _count are the counters
    prefill_tokens="vllm:request_prefill_kv_computed_tokens_sum",
    prefill_seconds="vllm:request_prefill_time_seconds_sum",
    prefill_requests="vllm:request_prefill_kv_computed_tokens_count",
)
# the reference replica (engines/replica/metrics.py): its cached tokens are the chunk store's
# (whatever tier served them), it has no separate external count and exports no running gauge
KVGATE = EngineNames(
    "kvgate",
    prompt_tokens="kvgate_replica_prompt_tokens_total",
    cached_tokens="kvgate_replica_cached_tokens_total",
    waiting="kvgate_replica_queue_length",
)
ENGINES: tuple[EngineNames, ...] = (VLLM, KVGATE)  # first match wins when a scrape has several kinds' names
ENGINE_SAMPLES = frozenset().union(*(engine.names() for engine in ENGINES))  # every sample name read here


@dataclass(frozen=True)
class ReplicaReading:
    """One replica's numbers from one scrape of its /metrics, whatever its engine. Counters are
    cumulative as the engine reports them (or, from `since`, one interval's growth); gauges are
    the values at the scrape."""

    engine: str  # EngineNames.kind
    prompt_tokens: float | None
    cached_tokens: float | None
    external_cached_tokens: float | None
    running: float | None
    waiting: float | None
    prefill_tokens: float | None = None
    prefill_seconds: float | None = None
    prefill_requests: float | None = None

    def since(self, previous: ReplicaReading | None) -> ReplicaReading:
        """The counters' growth since `previous` (a counter that went back, a restarted engine,
        counts from zero: stats_samples.gained); gauges as they are now. No previous reading, or
        one of another engine kind: the counters count from zero."""
        if previous is None or previous.engine != self.engine:
            return self
        grown: dict[str, float | None] = {}
        for name in COUNTERS:
            now, before = getattr(self, name), getattr(previous, name)
            grown[name] = None if now is None else gained(before or 0.0, now)
        return ReplicaReading(self.engine, running=self.running, waiting=self.waiting, **grown)


def engine_of(samples: Mapping[Key, float]) -> EngineNames | None:
    """The engine kind whose names the scrape carries (ENGINES' order breaks a tie); None: none."""
    present = {name for name, _ in samples}
    return next((engine for engine in ENGINES if engine.names() & present), None)


def replica_reading(samples: Mapping[Key, float]) -> ReplicaReading | None:
    """A replica's numbers from its flattened /metrics (replica_scrape.parse_metrics); None when
    no known engine's names are in it.

    Checked here against vLLM's and the reference replica's exposition text (tests/test_engine_metrics.py).
    A check against a live vLLM server (engines/vllm/launch.py) would assert, after one chat
    request, that `replica_reading(parse_metrics(<its /metrics text>))` has engine "vllm" and
    prompt_tokens > 0, and that a repeated long prompt raises cached_tokens."""
    engine = engine_of(samples)
    if engine is None:
        return None
    sums: dict[str, float] = {}
    for (name, _), value in samples.items():
        sums[name] = sums.get(name, 0.0) + value

    def read(field: str) -> float | None:
        name = getattr(engine, field)
        return None if name is None else sums.get(name)

    return ReplicaReading(engine.kind, **{field: read(field) for field in (*COUNTERS, *GAUGES)})
