"""The --entries run: proxy-level latency with N entries in the scope (kvgate.tools.bench.proxy_latency)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvgate.tools.bench.machine import machine_info
from kvgate.tools.bench.semantic.report import progress


def run_proxy(
    entries: int,
    queries: int,
    threshold: float,
    filler: str = "real",
    pairs_path: Path | None = None,
    positives_path: Path | None = None,
) -> dict[str, Any]:
    """The --entries benchmark (kvgate.tools.bench.proxy_latency) plus machine info."""
    from kvgate.tools.bench.proxy_latency import run_proxy_latency

    result = run_proxy_latency(
        entries, queries, threshold, progress, filler=filler, pairs_path=pairs_path, positives_path=positives_path
    )
    result["machine"] = machine_info()
    return result
