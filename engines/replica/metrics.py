"""Prometheus metrics of one replica app: per-request collectors fed by each Completion, and the
KV store's own counters read at scrape time (no second bookkeeping).

Names follow vLLM / LMCache: counters end in `_total` in the exposition (prometheus_client adds
it), hits are exported next to queries (a hit rate is hits / queries), sizes are gauges, times
are histograms. KV metrics carry `tier` = the chunk store tier's name ("memory", "disk"):

    kvgate_replica_kv_chunk_queries_total{tier}   chunk reads asked of the tier (a tier is asked
                                                  only after every faster one missed)
    kvgate_replica_kv_chunk_hits_total{tier}      reads the tier served, verified
    kvgate_replica_kv_chunk_misses_total          reads no tier served (absent or damaged)
    kvgate_replica_kv_chunk_writes_total{tier}    chunks written to the tier (promotions included)
    kvgate_replica_kv_chunk_promotions_total      slower-tier hits copied into faster tiers
    kvgate_replica_kv_chunks_damaged_total{tier}  chunks that failed verification (alert on it)
    kvgate_replica_kv_storage_failures_total{tier,kind}  soft failures: write, read, timeout,
                                                  too_big (the request went on without the tier)
    kvgate_replica_kv_evictions_total{tier}       objects the tier evicted for its budget
    kvgate_replica_kv_read_bytes_total, kvgate_replica_kv_written_bytes_total
    kvgate_replica_kv_bytes{tier}, kvgate_replica_kv_budget_bytes{tier}, kvgate_replica_kv_objects{tier}
    kvgate_replica_kv_tail_hits_total{tier}       partial-chunk tails reused ("memory" = RAM, else
                                                  the spill tier)
    kvgate_replica_kv_tails_damaged_total{tier}   spilled tails that failed verification
    kvgate_replica_kv_tail_bytes                  RAM held by tails
    kvgate_replica_kv_remote_up{tier}             1 while the remote tier's Redis answers, 0 while it
                                                  is down (its reads are misses, its writes skipped)
    kvgate_replica_kv_remote_errors_total{tier,op}   remote round trips that failed, by operation
                                                  (get, put, contains, delete, keys, clear, stats)
    kvgate_replica_kv_remote_skipped_total{tier,op}  remote operations not tried: Redis down and its
                                                  reconnect backoff not yet over
For the remote tier (a Redis shared by replicas) bytes, budget_bytes, objects and evictions are
the Redis instance's own (used_memory, maxmemory, DBSIZE, evicted_keys).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from kvgate.engines.replica.engine import ReplicaEngine
    from kvgate.engines.replica.types import Completion

SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)
FAILURE_KINDS = {"write_errors": "write", "read_errors": "read", "timeouts": "timeout", "rejected": "too_big"}


def _per_tier(family: CounterMetricFamily | GaugeMetricFamily, values: dict[str, Any]) -> Metric:
    for tier, value in values.items():
        family.add_metric([tier], value)
    return family


def kv_families(stats: dict[str, Any]) -> list[Metric]:
    """The KV metrics (module docstring) from ReplicaEngine.stats(): pure, one sample per tier
    the store has (families without samples when there is no store), so every name is always
    exposed and a value only ever comes from the store's or the tail cache's own counters."""
    store = stats.get("store") or {}
    tiers: dict[str, dict[str, Any]] = store.get("tiers", {})
    tails = stats.get("tails") or {}
    prefix = "kvgate_replica_kv_"

    def counter(name: str, doc: str, labels: Iterable[str] = ("tier",)) -> CounterMetricFamily:
        return CounterMetricFamily(prefix + name, doc, labels=list(labels))

    def gauge(name: str, doc: str, labels: Iterable[str] = ("tier",)) -> GaugeMetricFamily:
        return GaugeMetricFamily(prefix + name, doc, labels=list(labels))

    failures = counter(
        "storage_failures", "KV storage operations that failed softly (the request went on)", ("tier", "kind")
    )
    for tier, t in tiers.items():
        for key, kind in FAILURE_KINDS.items():
            if key in t:
                failures.add_metric([tier, kind], t[key])
    tail_hits = counter("tail_hits", "Partial-chunk tails reused, by where they were found")
    tails_damaged = counter("tails_damaged", "Spilled tails that failed verification (dropped)")
    if tails:
        tail_hits.add_metric(["memory"], tails.get("hits", 0))
        if tails.get("spill_tier"):
            tail_hits.add_metric([tails["spill_tier"]], tails.get("spill_hits", 0))
            tails_damaged.add_metric([tails["spill_tier"]], tails.get("spill_corrupt", 0))
    single = {
        "chunk_misses": ("KV chunk reads no tier served (absent or damaged)", store.get("misses")),
        "chunk_promotions": ("KV chunk hits in a slower tier copied into the faster ones", store.get("promotions")),
        "read_bytes": ("Bytes of KV chunks read from the store", store.get("bytes_read")),
        "written_bytes": ("Bytes of KV chunks written to the store's tiers", store.get("bytes_written")),
    }
    out: list[Metric] = [
        _per_tier(
            counter("chunk_queries", "KV chunk reads asked of the tier (after every faster tier missed)"),
            store.get("queries", {}),
        ),
        _per_tier(counter("chunk_hits", "KV chunk reads the tier served, verified"), store.get("hits", {})),
        _per_tier(
            counter("chunk_writes", "KV chunks written to the tier (promotions included)"), store.get("writes", {})
        ),
        _per_tier(
            counter("chunks_damaged", "KV chunks that failed verification (dropped, recomputed)"),
            store.get("corrupt_by_tier", {}),
        ),
        _per_tier(
            counter("evictions", "Objects the tier evicted to stay within its budget"),
            {tier: t.get("evictions", 0) for tier, t in tiers.items()},
        ),
        _per_tier(gauge("bytes", "Bytes the tier holds"), {tier: t.get("bytes", 0) for tier, t in tiers.items()}),
        _per_tier(
            gauge("budget_bytes", "The tier's byte budget"),
            {tier: t.get("budget_bytes", 0) for tier, t in tiers.items()},
        ),
        _per_tier(
            gauge("objects", "Objects the tier holds (KV chunks; on the spill tier also tails)"),
            {tier: t.get("items", 0) for tier, t in tiers.items()},
        ),
        failures,
        tail_hits,
        tails_damaged,
        *remote_families(tiers),
    ]
    for name, (doc, value) in single.items():
        family = counter(name, doc, ())
        if value is not None:
            family.add_metric([], value)
        out.append(family)
    ram = GaugeMetricFamily(prefix + "tail_bytes", "RAM held by partial-chunk tails")
    ram.add_metric([], tails.get("bytes", 0))
    out.append(ram)
    return out


def remote_families(tiers: dict[str, dict[str, Any]]) -> list[Metric]:
    """Health of the tiers that report it (those with "up" in their stats: the remote tier)."""
    prefix = "kvgate_replica_kv_remote_"
    up = GaugeMetricFamily(prefix + "up", "1 while the remote KV tier answers, 0 while it is down", labels=["tier"])
    errors = CounterMetricFamily(
        prefix + "errors", "Remote KV tier round trips that failed, by operation", labels=["tier", "op"]
    )
    skipped = CounterMetricFamily(
        prefix + "skipped", "Remote KV tier operations not tried (down, in backoff)", labels=["tier", "op"]
    )
    for tier, t in tiers.items():
        if "up" not in t:
            continue
        up.add_metric([tier], t["up"])
        for op, n in t.get("errors_by_op", {}).items():
            errors.add_metric([tier, op], n)
        for op, n in t.get("skipped_by_op", {}).items():
            skipped.add_metric([tier, op], n)
    return [up, errors, skipped]


class KVStoreCollector:
    """A prometheus_client collector reading the engine's store and tail counters at scrape time."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        yield from kv_families(self._stats())


class ReplicaMetrics:
    """Prometheus collectors of one replica app (own registry, no global state)."""

    def __init__(self, engine: ReplicaEngine) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("kvgate_replica_requests", "Chat requests by outcome", ["outcome"], registry=r)
        self.prompt_tokens = Counter("kvgate_replica_prompt_tokens", "Prompt tokens received", registry=r)
        self.cached_tokens = Counter(
            "kvgate_replica_cached_tokens", "Prompt tokens whose KV was loaded from the chunk store", registry=r
        )
        self.completion_tokens = Counter("kvgate_replica_completion_tokens", "Tokens generated", registry=r)
        self.stored_chunks = Counter("kvgate_replica_stored_chunks", "KV chunks newly written to the store", registry=r)
        self.prefill = Histogram(
            "kvgate_replica_prefill_seconds",
            "Prefill time (uncached prompt tokens)",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.load = Histogram(
            "kvgate_replica_kv_load_seconds",
            "Time to load KV chunks from the store",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "kvgate_replica_ttft_seconds", "Time to first token, queue included", buckets=SECONDS_BUCKETS, registry=r
        )
        queue_len = Gauge("kvgate_replica_queue_length", "Requests waiting for the model", registry=r)
        queue_len.set_function(lambda: engine.stats(store=False)["queue_len"])
        r.register(KVStoreCollector(engine.stats))

    def observe(self, c: Completion) -> None:
        self.requests.labels(outcome=c.finish_reason if c.finish_reason == "cancelled" else "completed").inc()
        self.prompt_tokens.inc(c.prompt_tokens)
        self.cached_tokens.inc(c.cached_tokens)
        self.completion_tokens.inc(c.completion_tokens)
        self.stored_chunks.inc(c.stored_chunks)
        self.prefill.observe(c.prefill_s)
        self.load.observe(c.load_s)
        self.ttft.observe(c.ttft_s)

    def render(self) -> bytes:
        """The registry in Prometheus text format; reads the disk tier's index (call off the
        event loop)."""
        return generate_latest(self.registry)
