"""Scrape-time Prometheus collectors: live numbers read when /metrics is scraped.

The routers, their KV-event feeds and the stores already count what they do; these collectors
only translate those numbers into metric families, so nothing is counted twice and nothing
drifts. Names follow the Prometheus / vLLM conventions: counters (``_total`` is added on
exposition) for things that happened, gauges for current state, ``_seconds`` for durations.
Labels are route and replica names and fixed words only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kvgate.index.kv.kv_events import FeedStats
from kvgate.middleware.telemetry.load_collector import ROUTE_REPLICA

if TYPE_CHECKING:
    from kvgate.index.storage.redis_link import RedisLink
    from kvgate.middleware.routing.router import Router
    from kvgate.middleware.telemetry.engine_metrics import ReplicaReading

log = logging.getLogger("kvgate.metrics")

_FEED_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("kvgate_kv_events_received", "KV cache events received in decoded batches", "events"),
    ("kvgate_kv_events_batches", "KV event batches applied to the prefix index", "batches"),
    ("kvgate_kv_events_decode_errors", "KV event messages dropped: not a decodable batch", "decode_errors"),
    ("kvgate_kv_events_apply_errors", "KV event batches whose application failed", "apply_errors"),
    ("kvgate_kv_events_sequence_gaps", "Times KV event sequence numbers jumped ahead (batches lost)", "gaps"),
    ("kvgate_kv_events_missed_batches", "KV event batches lost in sequence gaps", "missed_batches"),
    ("kvgate_kv_events_duplicate_batches", "KV event batches skipped as resends", "duplicates"),
    ("kvgate_kv_events_publisher_restarts", "KV event publishers seen restarting (replica blocks cleared)", "restarts"),
    ("kvgate_kv_events_blocks_stored", "Blocks added to the prefix index by BlockStored events", "blocks_stored"),
    (
        "kvgate_kv_events_blocks_removed",
        "Blocks dropped from the prefix index by BlockRemoved events",
        "blocks_removed",
    ),
    (
        "kvgate_kv_events_clears",
        "Times a replica's blocks were all dropped (AllBlocksCleared, restart, resync)",
        "clears",
    ),
    (
        "kvgate_kv_events_resyncs",
        "Times a replica's view was dropped because KV event batches were lost (sequence gap, undecodable message)",
        "resyncs",
    ),
    (
        "kvgate_kv_events_forgotten_mappings",
        "Engine block hashes forgotten at the event applier's bound (many engine hashes for one block)",
        "forgotten",
    ),
)
_FEED_IGNORED = ("wrong_block_size", "unknown_parent")  # FeedStats fields, as `reason` labels
# (family, help, PreciseRouting.stats() key): precise mode's own checks of router against engine
_PRECISE_COUNTERS = (
    ("kvgate_precise_matched_requests", "Routed requests whose first block the engine's events confirmed", "matched"),
    (
        "kvgate_precise_unmatched_requests",
        "Routed requests for which the engine stored blocks, none of them the "
        "request's: the router's tokenizer or chat template differs from the engine's",
        "unmatched",
    ),
    ("kvgate_precise_stale_drops", "Replica views dropped because its KV events stopped", "stale_drops"),
    (
        "kvgate_kv_events_replayed_batches",
        "KV event batches recovered from the engine's replay socket after a gap",
        "replayed_batches",
    ),
)


class RoutingCollector(Collector):
    """Per route and replica: the router's prefix index, and (precise mode) the KV-event feed
    that fills it."""

    def __init__(self, routers: Mapping[str, "Router"]) -> None:
        self._routers = dict(routers)

    def describe(self) -> Iterable[Metric]:
        return _routing_families().values()

    def collect(self) -> Iterable[Metric]:
        fam = _routing_families()
        for route, router in self._routers.items():
            index = router.index.stats()
            for replica in router.replicas:
                labels = [route, replica.name]
                fam["kvgate_replica_prefix_blocks"].add_metric(labels, index["blocks"].get(replica.name, 0))
                fam["kvgate_replica_prefix_evictions"].add_metric(labels, index["evictions"].get(replica.name, 0))
                cap = index["capacity"].get(replica.name)
                if cap is not None:
                    fam["kvgate_replica_prefix_capacity_blocks"].add_metric(labels, cap)
            for replica_name, feed in router.event_stats().items():
                _add_feed(fam, [route, replica_name], feed)
            for replica_name, checks in (router.precise.stats() if router.precise is not None else {}).items():
                for name, _, key in _PRECISE_COUNTERS:
                    fam[name].add_metric([route, replica_name], float(checks.get(key, 0)))  # type: ignore[arg-type]
            if router.precise is not None:
                for replica in router.replicas:
                    for tier in sorted(router.precise.tiers.readable(replica.name)):
                        fam["kvgate_replica_kv_tier_blocks"].add_metric(
                            [route, replica.name, tier], router.index.blocks(tier)
                        )
            fam["kvgate_route_load_cost"].add_metric([route], router.load_cost.value)
        return fam.values()


def _add_feed(fam: dict[str, Metric], labels: list[str], feed: FeedStats) -> None:
    for name, _, attr in _FEED_COUNTERS:
        fam[name].add_metric(labels, getattr(feed, attr))
    for reason in _FEED_IGNORED:
        fam["kvgate_kv_events_ignored"].add_metric([*labels, reason], getattr(feed, reason))
    fam["kvgate_kv_events_mapped_blocks"].add_metric(labels, feed.mapped_blocks)
    if feed.last_lag_s is not None:  # no sample before the first batch
        fam["kvgate_kv_events_last_lag_seconds"].add_metric(labels, feed.last_lag_s)
    buckets = [(_le(bound), count) for bound, count in feed.lag_buckets]
    fam["kvgate_kv_events_lag_seconds"].add_metric(labels, buckets, feed.lag_sum_s)


def _routing_families() -> dict[str, Metric]:
    """Fresh, empty families (a collector builds new ones per scrape)."""
    fam: dict[str, Metric] = {}
    fam["kvgate_replica_prefix_blocks"] = GaugeMetricFamily(
        "kvgate_replica_prefix_blocks",
        "Blocks the router's prefix index believes a replica holds",
        labels=ROUTE_REPLICA,
    )
    fam["kvgate_replica_prefix_evictions"] = CounterMetricFamily(
        "kvgate_replica_prefix_evictions",
        "Blocks the prefix index evicted at a replica's capacity (approximate: its modelled cache; precise: the "
        "memory bound, least recently stored or matched first)",
        labels=ROUTE_REPLICA,
    )
    fam["kvgate_replica_prefix_capacity_blocks"] = GaugeMetricFamily(
        "kvgate_replica_prefix_capacity_blocks",
        "A replica's bound in the prefix index, in blocks (absent: unbounded)",
        labels=ROUTE_REPLICA,
    )
    for name, doc, _ in (*_FEED_COUNTERS, *_PRECISE_COUNTERS):
        fam[name] = CounterMetricFamily(name, doc, labels=ROUTE_REPLICA)
    fam["kvgate_replica_kv_tier_blocks"] = GaugeMetricFamily(
        "kvgate_replica_kv_tier_blocks",
        "Blocks a KV tier the replica's engine reads holds (from the engines' KV events)",
        labels=[*ROUTE_REPLICA, "tier"],
    )
    fam["kvgate_route_load_cost"] = GaugeMetricFamily(
        "kvgate_route_load_cost",
        "What a token loaded from a KV tier costs in prefill tokens, as measured (1 until then)",
        labels=["route"],
    )
    fam["kvgate_kv_events_ignored"] = CounterMetricFamily(
        "kvgate_kv_events_ignored", "KV cache events not applied, by reason", labels=[*ROUTE_REPLICA, "reason"]
    )
    fam["kvgate_kv_events_mapped_blocks"] = GaugeMetricFamily(
        "kvgate_kv_events_mapped_blocks", "Engine block hashes currently mapped to the router's", labels=ROUTE_REPLICA
    )
    fam["kvgate_kv_events_last_lag_seconds"] = GaugeMetricFamily(
        "kvgate_kv_events_last_lag_seconds",
        "Latest KV event batch: applied-at minus its publish time",
        labels=ROUTE_REPLICA,
    )
    fam["kvgate_kv_events_lag_seconds"] = HistogramMetricFamily(
        "kvgate_kv_events_lag_seconds",
        "KV event batches: applied-at minus publish time (publisher's clock)",
        labels=ROUTE_REPLICA,
    )
    return fam


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


# (family, help, ReplicaReading field): what each replica's engine reports on its own /metrics
_ENGINE_COUNTERS: tuple[tuple[str, str, str], ...] = (
    (
        "kvgate_replica_engine_prompt_tokens",
        "Prompt tokens the replica's engine reports receiving (its own counter)",
        "prompt_tokens",
    ),
    (
        "kvgate_replica_engine_cached_tokens",
        "Prompt tokens whose KV the replica's engine reports reusing, local and external (its own counter)",
        "cached_tokens",
    ),
    (
        "kvgate_replica_engine_external_cached_tokens",
        "Cached prompt tokens the engine reports loading from outside itself (engines that count them)",
        "external_cached_tokens",
    ),
)
_ENGINE_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("kvgate_replica_engine_running", "Requests the replica's engine reports computing", "running"),
    ("kvgate_replica_engine_waiting", "Requests the replica's engine reports queued", "waiting"),
)


class EngineCollector(Collector):
    """Per route and replica: what the replica's engine reported on its own /metrics when the
    stats task last read it (middleware/server/ui.py; names per engine in middleware/telemetry/engine_metrics.py).

    Invariant: collect() makes no network call, it only copies the last reading. Counters are
    exported as the engine counts them (they reset when the engine restarts, which rate() handles);
    a replica not read at the last tick, or a number its engine does not export, has no sample.
    The same replica reads the same in every worker of `kvgate serve --workers N`: never sum
    these over workers."""

    def __init__(self, readings: Callable[[], Mapping[tuple[str, str], "ReplicaReading"]]) -> None:
        self.readings = readings  # replaced when a pipeline is reused by a newer app (Metrics.watch_engines)

    def describe(self) -> Iterable[Metric]:
        return _engine_families().values()

    def collect(self) -> Iterable[Metric]:
        fam = _engine_families()
        for (route, replica), reading in sorted(self.readings().items()):
            labels = [route, replica]
            fam["kvgate_replica_engine_info"].add_metric([*labels, reading.engine], 1.0)
            for name, _, field in (*_ENGINE_COUNTERS, *_ENGINE_GAUGES):
                value = getattr(reading, field)
                if value is not None:
                    fam[name].add_metric(labels, value)
        return fam.values()


def _engine_families() -> dict[str, Metric]:
    fam: dict[str, Metric] = {
        "kvgate_replica_engine_info": GaugeMetricFamily(
            "kvgate_replica_engine_info",
            "1 per replica read at the last tick; `engine` names its kind (vllm, kvgate)",
            labels=[*ROUTE_REPLICA, "engine"],
        )
    }
    for name, doc, _ in _ENGINE_COUNTERS:
        fam[name] = CounterMetricFamily(name, doc, labels=ROUTE_REPLICA)
    for name, doc, _ in _ENGINE_GAUGES:
        fam[name] = GaugeMetricFamily(name, doc, labels=ROUTE_REPLICA)
    return fam


class SoftFailing(Protocol):
    """A store whose `stats()` counts `storage_errors` (kvgate.index.storage.softfail) and maybe `damaged` items."""

    def stats(self) -> Mapping[str, Any]: ...


class StorageCollector(Collector):
    """Storage operations that failed without failing the request, per store (responses, request
    log): the figure to alert on when a disk fills up or a database is damaged."""

    def __init__(self, stores: Mapping[str, SoftFailing]) -> None:
        self._stores = dict(stores)

    def describe(self) -> Iterable[Metric]:
        return _storage_families().values()

    def collect(self) -> Iterable[Metric]:
        fam = _storage_families()
        for store, obj in self._stores.items():
            try:
                stats = obj.stats()
            except Exception:  # a store that cannot answer must not fail the whole scrape
                log.exception("metrics: stats of store %s failed", store)
                continue
            fam["kvgate_cache_storage_errors"].add_metric([store], stats.get("storage_errors", 0))
            if "damaged" in stats:
                fam["kvgate_cache_damaged_items"].add_metric([store], stats["damaged"])
        return fam.values()


def _storage_families() -> dict[str, Metric]:
    return {
        "kvgate_cache_storage_errors": CounterMetricFamily(
            "kvgate_cache_storage_errors",
            "Storage operations that failed softly (served without the store)",
            labels=["store"],
        ),
        "kvgate_cache_damaged_items": CounterMetricFamily(
            "kvgate_cache_damaged_items", "Stored items found damaged (checksum) and read as absent", labels=["store"]
        ),
    }


class StoreLinkCollector(Collector):
    """The shared store (`store:` backend redis): whether it answers, its failed operations, and
    how stale this process's view of its change log is. With the local backend only the lag is
    read (and up is 1)."""

    def __init__(self, link: "RedisLink | None", follow_lag_s: Callable[[], float | None]) -> None:
        self._link = link
        self._lag = follow_lag_s

    def describe(self) -> Iterable[Metric]:
        return _store_link_families().values()

    def collect(self) -> Iterable[Metric]:
        fam = _store_link_families()
        fam["kvgate_store_up"].add_metric([], 1.0 if self._link is None or self._link.up else 0.0)
        for op, count in sorted(dict(self._link.errors if self._link is not None else {}).items()):
            fam["kvgate_store_errors"].add_metric([op], count)
        lag = self._lag()
        if lag is not None:
            fam["kvgate_store_follow_lag_seconds"].add_metric([], lag)
        return fam.values()


def _store_link_families() -> dict[str, Metric]:
    return {
        "kvgate_store_up": GaugeMetricFamily(
            "kvgate_store_up", "1 while the shared store answers, 0 while its link backs off after a failure"
        ),
        "kvgate_store_errors": CounterMetricFamily(
            "kvgate_store_errors",
            "Shared-store operations that failed or were skipped while it was down",
            labels=["op"],
        ),
        "kvgate_store_follow_lag_seconds": GaugeMetricFamily(
            "kvgate_store_follow_lag_seconds",
            "Seconds since this process last read the store's change log through (catch-up lag)",
        ),
    }


class DecryptCollector(Collector):
    """Sealed values that did not authenticate (encryption.key_env), by layer (entries, vectors,
    marks): each one was read as a miss and dropped; after a master-key rotation the old values count
    here once each as they are met, otherwise a rise means tampering or a misconfigured key."""

    def __init__(self, failures: Callable[[], Mapping[str, int]]) -> None:
        self._failures = failures

    def describe(self) -> Iterable[Metric]:
        return [_decrypt_family()]

    def collect(self) -> Iterable[Metric]:
        fam = _decrypt_family()
        counts = dict(self._failures())
        for layer in ("entries", "vectors", "marks"):  # exported as 0 from the start: something to alert on
            counts.setdefault(layer, 0)
        for layer, count in sorted(counts.items()):
            fam.add_metric([layer], count)
        return [fam]


def _decrypt_family() -> CounterMetricFamily:
    return CounterMetricFamily(
        "kvgate_decrypt_failures",
        "Encrypted values that failed authentication (tampered, another key, or unencrypted): read as misses",
        labels=["layer"],
    )
