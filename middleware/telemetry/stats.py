"""The dashboard's history: a bounded ring of per-interval points, read by GET /v1/stats.

Each point is what the proxy's own Prometheus counters (and, where replicas are configured, the
replicas' /metrics) gained during one interval, condensed per route and per replica. Nothing is
counted twice: the numbers are the ones /metrics exports. Route and replica names, counts and
durations only; never prompts, answers, keys or tenants. A replica's prompt / cached tokens and
running / waiting requests are read through middleware/telemetry/engine_metrics.py, whatever its engine.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

from kvgate.middleware.telemetry.engine_metrics import ReplicaReading, replica_reading
from kvgate.middleware.telemetry.stats_samples import Samples, buckets, growth, quantile, total

OUTCOMES = ("exact", "semantic", "miss")
# what the dashboard reads of a kvgate replica's KV tiers (engines/replica/metrics.py), beside its
# engine numbers (engine_metrics.py)
TIER_SAMPLES = frozenset({"kvgate_replica_kv_bytes", "kvgate_replica_kv_chunk_hits_total"})
ReplicaId = tuple[str, str]  # (route, replica)
# every sample of the proxy's own registry a point is made of: the tick collects these alone
# (CollectorRegistry.restricted_registry), not the prefix index's, the stores' or the feeds'
OWN_SAMPLES = frozenset(
    {
        "kvgate_requests_total",
        "kvgate_backend_calls_total",
        "kvgate_tokens_saved_total",
        "kvgate_cost_saved_usd_total",
        "kvgate_cache_feedback_total",
        "kvgate_semantic_explorations_total",
        "kvgate_semantic_served_wrong_estimate_total",
        "kvgate_backend_failovers_total",
        "kvgate_request_seconds_bucket",
        "kvgate_time_to_first_token_seconds_bucket",
        "kvgate_replica_requests_total",
        "kvgate_replica_marked_down_total",
        "kvgate_replica_requests_in_flight",
        "kvgate_replica_up",
    }
)


@dataclass(frozen=True)
class Scrape:
    """One tick's readings: the proxy's registry and each replica's /metrics (None: unreachable
    or not scraped)."""

    at: float
    own: Samples
    replicas: Mapping[ReplicaId, Samples | None] = field(default_factory=dict)


class StatsRecorder:
    """Owned by the app (app.state.stats); `advance` turns a Scrape into a point, `view` serves them.
    `advance` and `view` are called from the event loop only, so the ring needs no lock."""

    def __init__(self, routes: list[str], replicas: list[ReplicaId], interval_s: float, keep: int) -> None:
        self.routes, self.replicas = routes, replicas
        self.interval_s = interval_s
        self.points: deque[dict[str, Any]] = deque(maxlen=keep)
        self._own: Samples = {}
        self._remote: dict[ReplicaId, Samples] = {}
        self._totals: dict[str, Any] = {}
        self._readings: dict[ReplicaId, ReplicaReading] = {}  # each replica's last recognised reading

    def advance(self, scrape: Scrape) -> dict[str, Any]:
        """Append the point for the interval that ends at `scrape.at`."""
        gained = growth(self._own, scrape.own)
        point: dict[str, Any] = {"t": round(scrape.at, 3), "routes": {}, "replicas": {}}
        for route in self.routes:
            point["routes"][route] = {**_route_point(gained, route), "cum": _route_counts(scrape.own, route)}
        for rid in self.replicas:
            remote = scrape.replicas.get(rid)
            remote_gained = growth(self._remote.get(rid, {}), remote) if remote is not None else None
            reading = replica_reading(remote) if remote is not None else None
            # like the samples, the interval runs from the last reading taken, so a missed scrape's
            # growth lands in the next point instead of being lost
            interval = reading.since(self._readings.get(rid)) if reading is not None else None
            if remote is not None:
                self._remote[rid] = remote
            if reading is not None:
                self._readings[rid] = reading
            point["replicas"]["/".join(rid)] = _replica_point(gained, scrape.own, rid, remote_gained, remote, interval)
        self._own = scrape.own
        self._totals = {route: _route_counts(scrape.own, route) for route in self.routes}
        self.points.append(point)
        return point

    def view(self, since: float | None = None) -> dict[str, Any]:
        """The JSON of /v1/stats: settings, totals since start, and the points after `since`."""
        points = [p for p in self.points if since is None or p["t"] > since]
        return {
            "object": "kvgate.stats",
            "interval_s": self.interval_s,
            "keep": self.points.maxlen,
            "routes": self.routes,
            "replicas": ["/".join(r) for r in self.replicas],
            "totals": self._totals,
            "points": points,
        }


def _route_counts(samples: Samples, route: str) -> dict[str, float]:
    """Cumulative counts of one route (requests by outcome, savings, feedback)."""
    counts = {o: total(samples, "kvgate_requests_total", route=route, cache=o) for o in OUTCOMES}
    counts["error"] = total(samples, "kvgate_backend_calls_total", route=route, outcome="error")
    counts["tokens_saved"] = total(samples, "kvgate_tokens_saved_total", route=route)
    counts["cost_saved"] = _r(total(samples, "kvgate_cost_saved_usd_total", route=route))
    counts["correct"] = total(samples, "kvgate_cache_feedback_total", route=route, verdict="correct")
    counts["wrong"] = total(samples, "kvgate_cache_feedback_total", route=route, verdict="wrong")
    # semantic.max_error_rate routes (middleware/cache/trust_gate.py): explorations, and the expected
    # number of wrong hits among those served (the sum of their estimated P(wrong))
    counts["explorations"] = total(samples, "kvgate_semantic_explorations_total", route=route)
    counts["wrong_estimate"] = _r(total(samples, "kvgate_semantic_served_wrong_estimate_total", route=route))
    return counts


def _route_point(gained: Samples, route: str) -> dict[str, Any]:
    """One interval of one route: its counts plus latency and TTFT quantiles from histogram growth."""
    hits = buckets(gained, "kvgate_request_seconds", route=route, cache=("exact", "semantic"))
    misses = buckets(gained, "kvgate_request_seconds", route=route, cache="miss")
    ttft = buckets(gained, "kvgate_time_to_first_token_seconds", route=route, cache="miss")
    return {
        **_route_counts(gained, route),
        "failovers": total(gained, "kvgate_backend_failovers_total", route=route),
        "hit_p50": _r(quantile(hits, 0.5)),
        "hit_p99": _r(quantile(hits, 0.99)),
        "miss_p50": _r(quantile(misses, 0.5)),
        "miss_p99": _r(quantile(misses, 0.99)),
        "ttft_p50": _r(quantile(ttft, 0.5)),
        "ttft_p99": _r(quantile(ttft, 0.99)),
    }


def _replica_point(
    gained: Samples,
    own: Samples,
    rid: ReplicaId,
    remote_gained: Samples | None,
    remote: Samples | None,
    interval: ReplicaReading | None,
) -> dict[str, Any]:
    """The router's view of a replica, plus what the replica itself reports when it was scraped:
    tokens (this interval's growth) and running / waiting (at the tick) from `interval`, its
    engine's reading; `engine` is null where no known engine's names were found."""
    route, replica = rid
    point: dict[str, Any] = {
        "requests": total(gained, "kvgate_replica_requests_total", route=route, replica=replica),
        "marked_down": total(gained, "kvgate_replica_marked_down_total", route=route, replica=replica),
        "in_flight": total(own, "kvgate_replica_requests_in_flight", route=route, replica=replica),
        "up": total(own, "kvgate_replica_up", route=route, replica=replica),
        "scraped": remote is not None,
    }
    if remote is not None and remote_gained is not None:
        tiers = sorted(
            {
                dict(labels)["tier"]
                for name, labels in remote
                if name == "kvgate_replica_kv_bytes" and "tier" in dict(labels)
            }
        )
        point.update(_engine_fields(interval))
        point["kv_bytes"] = {t: total(remote, "kvgate_replica_kv_bytes", tier=t) for t in tiers}
        point["kv_hits"] = {t: total(remote_gained, "kvgate_replica_kv_chunk_hits_total", tier=t) for t in tiers}
    return point


def _engine_fields(interval: ReplicaReading | None) -> dict[str, Any]:
    """prompt_tokens and cached_tokens stay numbers (0 when unknown) as they always were; the
    newer fields are null where the engine has no such number."""
    if interval is None:
        return {
            "prompt_tokens": 0.0,
            "cached_tokens": 0.0,
            "engine": None,
            "external_cached_tokens": None,
            "running": None,
            "waiting": None,
        }
    return {
        "prompt_tokens": interval.prompt_tokens or 0.0,
        "cached_tokens": interval.cached_tokens or 0.0,
        "engine": interval.engine,
        "external_cached_tokens": interval.external_cached_tokens,
        "running": interval.running,
        "waiting": interval.waiting,
    }


def _r(value: float | None) -> float | None:
    """Six significant digits keep the JSON short."""
    return None if value is None else float(f"{value:.6g}")
