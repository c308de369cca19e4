"""`kvgate bench vllm-client`'s summary (pure) and its command line (the run itself needs real vLLM:
`make bench`)."""

from __future__ import annotations

import subprocess
import sys

from kvgate.tools.bench.vllm_client_arena import summarize


def run(mean: float, median: float, cached: float | None, failed: int = 0) -> dict:
    return {
        "router": "r",
        "completed": 8,
        "failed": failed,
        "mean_ttft_ms": mean,
        "median_ttft_ms": median,
        "p99_ttft_ms": mean * 3,
        "request_throughput": 2.0,
        "cached_fraction": cached,
        "wall_s": 1.0,
    }


def test_summary_pools_runs() -> None:
    s = summarize([run(100, 80, 0.5), run(120, 90, 0.7, failed=1), run(110, 85, None)])
    assert s["ttft_mean_ms"] == 110.0 and s["ttft_mean_ci_ms"] > 0
    assert s["ttft_median_ms"] == 85.0 and s["cached_fraction"] == 0.6
    assert (s["completed"], s["failed"]) == (24, 1) and len(s["runs"]) == 3


def test_cli_lists_it() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvgate.middleware.cli", "bench", "vllm-client", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "--num-prompts" in out.stdout
