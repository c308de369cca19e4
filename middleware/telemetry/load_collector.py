"""Scrape-time collector of the routers' load view: per route and replica, the requests sent, the
circuit's openings, the requests in flight, the queued prefill and the failures in a row.

A collector of its own, apart from the prefix index and the KV-event feeds
(kvgate.middleware.telemetry.collectors.RoutingCollector), so the dashboard's tick
(kvgate.middleware.server.ui) reads these few samples without building the rest. Imports the
routers' types only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from kvgate.middleware.routing.base import ReplicaState
    from kvgate.middleware.routing.router import Router

ROUTE_REPLICA = ("route", "replica")

# (family, help, value of one replica); counters first, then gauges.
_REPLICA_COUNTERS: tuple[tuple[str, str, Callable[["ReplicaState"], float]], ...] = (
    ("kvgate_replica_requests", "Attempts the router sent to a replica", lambda r: r.requests),
    ("kvgate_replica_marked_down", "Times a replica's circuit opened after a failure", lambda r: r.marked_down),
)
_REPLICA_GAUGES: tuple[tuple[str, str, Callable[["ReplicaState"], float]], ...] = (
    ("kvgate_replica_requests_in_flight", "Requests sent to a replica and not finished", lambda r: r.in_flight),
    (
        "kvgate_replica_pending_prefill_tokens",
        "Uncached prompt tokens of requests not yet past their first token: the queue the policy sees",
        lambda r: r.pending_prefill_tokens,
    ),
    ("kvgate_replica_consecutive_failures", "Failures in a row (0 after a success)", lambda r: r.failures),
)


class ReplicaLoadCollector(Collector):
    """The families above, per route and replica, read from each router's replica states."""

    def __init__(self, routers: Mapping[str, "Router"]) -> None:
        self._routers = dict(routers)

    def describe(self) -> Iterable[Metric]:
        return _load_families().values()

    def collect(self) -> Iterable[Metric]:
        fam = _load_families()
        for route, router in self._routers.items():
            router.refresh_load()  # every worker's load, not only this one's
            for replica in router.replicas:
                labels = [route, replica.name]
                for name, _, value in (*_REPLICA_COUNTERS, *_REPLICA_GAUGES):
                    fam[name].add_metric(labels, float(value(replica)))
        return fam.values()


def _load_families() -> dict[str, Metric]:
    """Fresh, empty families (a collector builds new ones per scrape)."""
    fam: dict[str, Metric] = {}
    for name, doc, _ in _REPLICA_COUNTERS:
        fam[name] = CounterMetricFamily(name, doc, labels=ROUTE_REPLICA)
    for name, doc, _ in _REPLICA_GAUGES:
        fam[name] = GaugeMetricFamily(name, doc, labels=ROUTE_REPLICA)
    return fam
