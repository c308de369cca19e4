"""Pure helpers over Prometheus samples: flatten a scrape, take the difference of two, read a
quantile from histogram buckets. The dashboard's history (middleware/telemetry/stats.py) is built from the
same counters /metrics exports, so the two can never disagree.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

from prometheus_client.metrics_core import Metric

Labels = tuple[tuple[str, str], ...]
Key = tuple[str, Labels]
Samples = dict[Key, float]

# sample names that only grow (counters and histogram parts); everything else is a gauge
_GROWING = ("_total", "_bucket", "_count", "_sum")


def flatten(families: Iterable[Metric]) -> Samples:
    """{(sample name, sorted labels): value}; `_created` timestamps are left out."""
    out: Samples = {}
    for family in families:
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                out[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return out


def growth(previous: Mapping[Key, float], current: Mapping[Key, float]) -> Samples:
    """What each growing sample gained since `previous` (never negative: a counter that went back,
    e.g. a restarted replica, counts from zero again)."""
    return {key: gained(previous.get(key, 0.0), value) for key, value in current.items() if key[0].endswith(_GROWING)}


def gained(before: float, after: float) -> float:
    """What a counter gained from `before` to `after`; one that went back (its process restarted)
    counts from zero again, so growth is never negative."""
    return after - before if after >= before else after


def total(samples: Mapping[Key, float], name: str, **match: str | tuple[str, ...]) -> float:
    """Sum of the samples called `name` whose labels match (a tuple matches any of its values)."""
    return sum(value for (sample, labels), value in samples.items() if sample == name and _matches(dict(labels), match))


def buckets(samples: Mapping[Key, float], name: str, **match: str | tuple[str, ...]) -> list[tuple[float, float]]:
    """A histogram's cumulative (upper bound, count) pairs, summed over the matching series."""
    by_bound: dict[float, float] = {}
    for (sample, labels), value in samples.items():
        label_map = dict(labels)
        if sample == name + "_bucket" and _matches(label_map, match):
            bound = float(label_map["le"])
            by_bound[bound] = by_bound.get(bound, 0.0) + value
    return sorted(by_bound.items())


def quantile(cumulative: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear inside the bucket holding rank q·n; None without
    observations. A rank in the +Inf bucket reports the highest finite bound."""
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    rank = q * cumulative[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank and count > below:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = (bound if not math.isinf(bound) else lower), count
    return lower


def _matches(labels: Mapping[str, str], match: Mapping[str, str | tuple[str, ...]]) -> bool:
    for name, wanted in match.items():
        value = labels.get(name)
        if value is None or (value not in wanted if isinstance(wanted, tuple) else value != wanted):
            return False
    return True
