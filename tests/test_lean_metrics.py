"""The lean counters and histograms export what prometheus_client's families export for the same
updates, in both expositions, and lose no update under threads."""

from __future__ import annotations

import re
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from kvgate.middleware.telemetry.lean_metrics import LeanCounter, LeanHistogram, exports_created
from kvgate.middleware.telemetry.metrics import LATENCY_BUCKETS, Metrics

LABELS = ["route", "tier"]
VALUES = st.tuples(st.sampled_from(["chat", "r-2", 'quote"d', "ünï"]), st.sampled_from(["exact", "semantic", "miss"]))
# bucket edges, values next to them, and ordinary durations
AMOUNTS = st.one_of(
    st.sampled_from(LATENCY_BUCKETS),
    st.sampled_from([b * (1 + 1e-12) for b in LATENCY_BUCKETS]),
    st.floats(min_value=0, max_value=120, allow_nan=False),
    st.just(1e9),
)


def _expositions(registry: CollectorRegistry) -> tuple[str, str]:
    """Both expositions with the `_created` values blanked (each child's creation time)."""
    blank = re.compile(r"(_created(?:\{[^}]*\})? )\S+")
    return tuple(blank.sub(r"\1T", text.decode()) for text in (generate_latest(registry), openmetrics_latest(registry)))


def _pair(kind: str) -> tuple[CollectorRegistry, object, CollectorRegistry, object]:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    created = exports_created()
    if kind == "counter":
        lean = LeanCounter("kvgate_x", "Some things", LABELS, ours, created)
        reference = Counter("kvgate_x", "Some things", LABELS, registry=theirs)
    else:
        lean = LeanHistogram("kvgate_x", "Some seconds", LABELS, ours, created, LATENCY_BUCKETS)
        reference = Histogram("kvgate_x", "Some seconds", LABELS, buckets=LATENCY_BUCKETS, registry=theirs)
    return ours, lean, theirs, reference


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(["counter", "histogram"]), updates=st.lists(st.tuples(VALUES, AMOUNTS), max_size=40))
def test_lean_families_export_what_prometheus_client_exports(kind, updates):
    ours, lean, theirs, reference = _pair(kind)
    for values, amount in updates:
        for family in (lean, reference):
            child = family.labels(*values)
            child.inc(amount) if kind == "counter" else child.observe(amount)
    assert _expositions(ours) == _expositions(theirs)


def test_label_values_are_keyed_as_their_strs_and_counted_once():
    ours, lean, theirs, reference = _pair("counter")
    for family in (lean, reference):
        family.labels(1, "exact").inc()
        family.labels("1", "exact").inc(2)
        family.labels(True, "exact").inc(4)
    assert _expositions(ours) == _expositions(theirs)
    assert lean.labels("1", "exact").value == 3.0


def test_bad_updates_are_refused_as_prometheus_client_refuses_them():
    _, lean, _, _ = _pair("counter")
    with pytest.raises(ValueError, match="non-negative"):
        lean.labels("chat", "exact").inc(-1)
    with pytest.raises(ValueError, match="2 label values expected"):
        lean.labels("chat")
    with pytest.raises(ValueError, match="ascending"):
        LeanHistogram("kvgate_y", "", LABELS, CollectorRegistry(), True, (1.0, 0.5))
    registry = CollectorRegistry()
    LeanCounter("kvgate_z", "", LABELS, registry, True)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Counter("kvgate_z", "", LABELS, registry=registry)


def test_threads_lose_no_update():
    _, counter, _, _ = _pair("counter")
    _, histogram, _, _ = _pair("histogram")

    def work() -> None:
        for i in range(20_000):
            counter.labels("chat", "exact").inc()
            histogram.labels("chat", "exact").observe(0.003 if i % 2 else 7.0)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.labels("chat", "exact").value == 80_000
    child = histogram.labels("chat", "exact")
    assert sum(child.counts) == 80_000 and child.counts[LATENCY_BUCKETS.index(0.005)] == 40_000
    assert child.sum == pytest.approx(40_000 * 0.003 + 40_000 * 7.0)


def test_created_follows_prometheus_client_switch():
    from prometheus_client import disable_created_metrics, enable_created_metrics

    assert exports_created()
    disable_created_metrics()
    try:
        assert not exports_created()
        metrics = Metrics()
        metrics.requests.labels("chat", "miss").inc()
        assert b"_created" not in metrics.render()
    finally:
        enable_created_metrics()
    metrics = Metrics()
    metrics.requests.labels("chat", "miss").inc()
    metrics.latency.labels("chat", "miss").observe(0.2)
    text = metrics.render().decode()
    assert 'kvgate_requests_created{cache="miss",route="chat"}' in text
    assert 'kvgate_request_seconds_bucket{cache="miss",le="0.25",route="chat"} 1.0' in text
