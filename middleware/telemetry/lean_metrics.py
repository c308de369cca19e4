"""Counters and histograms for the labelled families every request updates.

prometheus_client's children check, then lock once per value they touch, and its histogram walks
its buckets one by one on every observation. These children add under one lock and find a
histogram's bucket by bisection. A family is a collector: at scrape time it exports the samples
prometheus_client's own family would for the same updates (names, label order, cumulative
buckets, `_count`, `_sum`, `_created`), so the exposition reads the same.

Invariant: after the same `labels(...)` / `inc` / `observe` calls, `collect()` yields the samples of
the prometheus_client family of the same name, type, labels and buckets, `_created` values aside
(each is its child's creation time). Histogram observations are finite (durations).
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from typing import Any, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import INF, floatToGoString


class CounterChild:
    """One label set's counter."""

    __slots__ = ("value", "created", "_lock")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()
        self._lock = threading.Lock()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        with self._lock:
            self.value += amount

    def samples(self, created: bool) -> list[tuple[str, dict[str, str], float]]:
        out = [("_total", {}, self.value)]
        if created:
            out.append(("_created", {}, self.created))
        return out


class HistogramChild:
    """One label set's histogram: a count per bucket (not cumulative until exported) and a sum."""

    __slots__ = ("bounds", "counts", "sum", "created", "_lock")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds  # ascending, +Inf last: bisect_left finds the first bound >= the value
        self.counts = [0.0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()
        self._lock = threading.Lock()

    def observe(self, amount: float) -> None:
        i = bisect_left(self.bounds, amount)
        with self._lock:
            self.counts[i] += 1.0
            self.sum += amount

    def samples(self, created: bool) -> list[tuple[str, dict[str, str], float]]:
        with self._lock:
            counts, total = list(self.counts), self.sum
        out: list[tuple[str, dict[str, str], float]] = []
        acc = 0.0
        for bound, count in zip(self.bounds, counts):
            acc += count
            out.append(("_bucket", {"le": floatToGoString(bound)}, acc))
        out.append(("_count", {}, acc))
        if self.bounds[0] >= 0:  # as prometheus_client: no sum where a bucket takes negative values
            out.append(("_sum", {}, total))
        if created:
            out.append(("_created", {}, self.created))
        return out


class _Family:
    """A labelled family registered on `registry`; its children are made on first use."""

    kind = ""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry, created: bool
    ) -> None:
        if not labelnames:
            raise ValueError(f"{name}: a lean family is labelled")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.created = created  # prometheus_client's own switch for `_created`, read by the caller
        self._children: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def labels(self, *values: Any) -> Any:
        """The child of these label values (each as its str, as prometheus_client keys them)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected, got {len(values)}")
            # keyed by the strs only: 1 and True are one dict key, "1" and "True" two series
            key = tuple(str(v) for v in values)
            with self._lock:  # two threads asking at once get the same child
                child = self._children.get(key)
                if child is None:
                    child = self._children[key] = self._child()
        return child

    def _child(self) -> Any:
        raise NotImplementedError

    def describe(self) -> Iterable[Metric]:
        return [Metric(self.name, self.documentation, self.kind)]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        with self._lock:
            children = list(self._children.items())
        for key, child in children:
            series = list(zip(self.labelnames, key))
            for suffix, extra, value in child.samples(self.created):
                metric.add_sample(self.name + suffix, dict(series + list(extra.items())), value)
        return [metric]


class LeanCounter(_Family):
    kind = "counter"

    def _child(self) -> CounterChild:
        return CounterChild()


class LeanHistogram(_Family):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
        created: bool,
        buckets: Sequence[float],
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError(f"{name}: buckets not in ascending order")
        if not bounds or bounds[-1] != INF:
            bounds.append(INF)
        if len(bounds) < 2:
            raise ValueError(f"{name}: at least one bucket below +Inf")
        self.bounds = tuple(bounds)
        super().__init__(name, documentation, labelnames, registry, created)

    def _child(self) -> HistogramChild:
        return HistogramChild(self.bounds)


def exports_created() -> bool:
    """Whether prometheus_client's own counters export `_created` (its switch: the
    PROMETHEUS_DISABLE_CREATED_SERIES environment variable, or disable_created_metrics()), asked
    of a throwaway counter so the lean families follow the same switch."""
    probe = Counter("kvgate_probe", "", registry=None)
    return any(sample.name.endswith("_created") for metric in probe.collect() for sample in metric.samples)
