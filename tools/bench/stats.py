"""Small helpers every benchmark shares: percentiles and writing the JSON result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np


def pct(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 1] (p99 of fewer than 100 samples is the maximum); NaN if empty."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def percentiles_ms(samples_s: Sequence[float]) -> tuple[float | None, float | None]:
    """(p50, p99) in milliseconds, interpolated, None for an empty sample."""
    if not samples_s:
        return None, None
    arr = np.asarray(samples_s) * 1000.0
    return round(float(np.percentile(arr, 50)), 3), round(float(np.percentile(arr, 99)), 3)


def write_json(path: Path | None, result: dict[str, Any]) -> None:
    """Write a benchmark's result (indent 2), creating parent folders; no-op without a path."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
