"""Prometheus collectors, one registry per Metrics object (no module-level state)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvgate.middleware.telemetry.collectors import (
    DecryptCollector,
    EngineCollector,
    RoutingCollector,
    SoftFailing,
    StorageCollector,
    StoreLinkCollector,
)
from kvgate.middleware.telemetry.lean_metrics import LeanCounter, LeanHistogram, exports_created
from kvgate.middleware.telemetry.load_collector import ReplicaLoadCollector

if TYPE_CHECKING:
    from kvgate.index.storage.redis_link import RedisLink
    from kvgate.middleware.routing.router import Router
    from kvgate.middleware.telemetry.engine_metrics import ReplicaReading

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Metrics:
    """Labels are route names and fixed words only: never prompts, keys or tenants."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # the families a request updates, lean (kvgate.middleware.telemetry.lean_metrics); the rest
        # change rarely and stay prometheus_client's
        created = exports_created()

        def counter(name: str, doc: str, labels: list[str]) -> LeanCounter:
            return LeanCounter(name, doc, labels, r, created)

        def seconds(name: str, doc: str, labels: list[str]) -> LeanHistogram:
            return LeanHistogram(name, doc, labels, r, created, LATENCY_BUCKETS)

        self.lookups = counter("kvgate_cache_lookups", "Cache lookups by tier", ["route", "tier"])
        self.hits = counter("kvgate_cache_hits", "Cache hits by tier", ["route", "tier"])
        self.requests = counter("kvgate_requests", "Requests by outcome", ["route", "cache"])
        self.backend_calls = counter("kvgate_backend_calls", "Backend calls", ["route", "outcome"])
        self.stores = counter("kvgate_cache_stores", "Answers written / skipped", ["route", "result"])
        self.latency = seconds("kvgate_request_seconds", "Request latency in the pipeline", ["route", "cache"])
        # vLLM's convention: TTFT as a histogram; here from the request's arrival to the first chunk
        # a streamed answer sends (a replayed hit's first chunk, or the backend's)
        self.ttft = seconds(
            "kvgate_time_to_first_token_seconds", "Streamed requests: arrival to first chunk", ["route", "cache"]
        )
        self.lookup_latency = seconds("kvgate_lookup_seconds", "Cache lookup latency", ["route", "tier"])
        self.tokens_saved = counter("kvgate_tokens_saved", "Tokens not sent to a backend thanks to hits", ["route"])
        self.cost_saved = counter(
            "kvgate_cost_saved_usd", "Estimated USD saved by hits (where LiteLLM knows the price)", ["route"]
        )
        self.feedback = Counter(
            "kvgate_cache_feedback", "Feedback on served answers", ["route", "tier", "verdict"], registry=r
        )
        self.feedback_removed = Counter(
            "kvgate_feedback_entries_removed", "Entries deleted by wrong-answer feedback", ["route"], registry=r
        )
        self.feedback_tightened = Counter(
            "kvgate_feedback_entries_tightened", "Entries whose similarity floor feedback raised", ["route"], registry=r
        )
        self.entries = Gauge("kvgate_cache_entries", "Entries in the response cache", registry=r)
        self.cache_bytes = Gauge(
            "kvgate_cache_bytes", "Bytes of stored answers + vectors (budget: max_bytes)", registry=r
        )
        self.verifier_rejections = Counter(
            "kvgate_verifier_rejections",
            "Semantic lookups whose cosine candidates the verifier all rejected",
            ["route"],
            registry=r,
        )
        # semantic.max_error_rate routes (kvgate.middleware.cache.trust_gate)
        self.explorations = Counter(
            "kvgate_semantic_explorations",
            "Candidates explored (sent to the backend and compared) instead of served",
            ["route"],
            registry=r,
        )
        self.exploration_verdicts = Counter(
            "kvgate_semantic_exploration_verdicts",
            "Explorations' comparisons: the cached answer agreed with the fresh one or not",
            ["route", "verdict"],
            registry=r,
        )
        self.served_wrong_estimate = Counter(
            "kvgate_semantic_served_wrong_estimate",
            "Sum over served semantic hits of their estimated P(wrong): the expected wrong hits served",
            ["route"],
            registry=r,
        )
        # when: before_first_byte (nothing sent yet) | mid_stream (resumed after what was sent)
        self.expected_cached = counter(
            "kvgate_replica_expected_cached_tokens",
            "Prompt tokens of misses the router expected the chosen replica to find cached (its prefix-index match)",
            ["route", "replica"],
        )
        self.reported_cached = counter(
            "kvgate_replica_reported_cached_tokens",
            "Prompt tokens the replica reported cached on the same misses (usage.prompt_tokens_details.cached_tokens)",
            ["route", "replica"],
        )
        self.cache_surprises = Counter(
            "kvgate_replica_cache_surprises",
            "Misses whose reported cached tokens differ from the expected by a "
            "block or more (direction more|less): a view of the replica's cache that is wrong",
            ["route", "replica", "direction"],
            registry=r,
        )
        self.failovers = Counter(
            "kvgate_backend_failovers",
            "Requests moved to another replica after a failure",
            ["route", "when"],
            registry=r,
        )
        # the proxy's asyncio loop (kvgate.middleware.telemetry.loop_lag): how late a sleeping task wakes up
        # (250 ms naps while requests come, 1 s naps while idle)
        self.loop_lag = Histogram(
            "kvgate_event_loop_lag_seconds",
            "Event-loop lag: oversleep of a timer (250 ms while requests come, 1 s while idle)",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        # admission control (kvgate.middleware.server.admission): chat completions being served, and refused
        self.in_flight = Gauge("kvgate_requests_in_flight", "Chat completions admitted and not finished", registry=r)
        self.rejected = Counter(
            "kvgate_requests_rejected", "Chat completions refused before any work", ["reason"], registry=r
        )
        self.rejected.labels("overloaded")  # exported as 0 from the start: something to alert on
        self.replica_up = Gauge(
            "kvgate_replica_up",
            "1 while a replica takes traffic, 0 while its circuit is open",
            ["route", "replica"],
            registry=r,
        )
        self._engines: EngineCollector | None = None  # registered by the first watch_engines

    def watch_replica(self, route: str, replica: Any) -> None:
        """Export kvgate_replica_up for one of `route`'s replicas (at start, and when one is added
        while the proxy runs: middleware/server/admin.py)."""
        self.replica_up.labels(route, replica.name).set_function(lambda r=replica: float(r.healthy))

    def forget_replica(self, route: str, name: str) -> None:
        """Stop exporting kvgate_replica_up for a replica removed from `route`."""
        self.replica_up.remove(route, name)

    def watch(self, routers: Mapping[str, "Router"], stores: Mapping[str, SoftFailing]) -> None:
        """Export these objects' own counters at scrape time (kvgate.middleware.telemetry.collectors): routers
        (replica load, prefix index, KV-event feeds) and stores (soft storage failures)."""
        self.registry.register(ReplicaLoadCollector(routers))
        self.registry.register(RoutingCollector(routers))
        self.registry.register(StorageCollector(stores))

    def watch_store(self, link: "RedisLink | None", follow_lag_s: Callable[[], float | None]) -> None:
        """Export the shared store's health at scrape time: kvgate_store_up, kvgate_store_errors_total{op},
        kvgate_store_follow_lag_seconds (kvgate.middleware.telemetry.collectors.StoreLinkCollector)."""
        self.registry.register(StoreLinkCollector(link, follow_lag_s))

    def watch_decrypt(self, failures: Callable[[], Mapping[str, int]]) -> None:
        """Export kvgate_decrypt_failures_total{layer} at scrape time, from the entry store's cipher
        (kvgate.index.storage.cipher; only when encryption.key_env is set)."""
        self.registry.register(DecryptCollector(failures))

    def watch_engines(self, readings: Callable[[], Mapping[tuple[str, str], "ReplicaReading"]]) -> None:
        """Export what each replica's engine last reported, per {route,replica}, at scrape time:
        kvgate_replica_engine_prompt_tokens_total, _cached_tokens_total, _external_cached_tokens_total,
        kvgate_replica_engine_running, _waiting, _info{engine} (kvgate.middleware.telemetry.collectors.EngineCollector).
        A second call (a pipeline reused by a new app, with a new recorder) repoints the one collector:
        a registry refuses the same names twice."""
        if self._engines is None:
            self._engines = EngineCollector(readings)
            self.registry.register(self._engines)
        else:
            self._engines.readings = readings

    def render(self) -> bytes:
        return generate_latest(self.registry)
