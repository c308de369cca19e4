"""The proxy that `kvgate bench loop-load` measures, in both of its modes: the route it serves, and
what is read off the running process (its CPU seconds from /proc, its event-loop lag histogram from
/metrics, py-spy's stacks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def config(replicas: list[str], tokenizer: str, cache_dir: str, block_size: int = 16) -> dict[str, Any]:
    return {
        "cache_dir": cache_dir,
        "routes": [
            {
                "name": "load",
                "model": "*",
                "backend": {"model": "openai/demo", "api_key": "none", "timeout": 120},
                "exact": True,
                "semantic": {"enabled": False},
                "replicas": [{"name": f"r{i}", "api_base": f"{u}/v1"} for i, u in enumerate(replicas)],
                "routing": {
                    "policy": "cache_aware",
                    "prefix": {"tokenizer": tokenizer, "block_size": block_size, "record_answers": True},
                },
            }
        ],
        "server": {"max_body_bytes": 64 * 1024 * 1024},
    }


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def lag_histogram(metrics_text: str) -> dict[str, float]:
    """The lag histogram's samples: `le` bounds → cumulative counts, plus `sum` and `count`."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(metrics_text):
        if fam.name == "kvgate_event_loop_lag_seconds":
            for s in fam.samples:
                out[s.labels["le"] if s.name.endswith("_bucket") else s.name.rsplit("_", 1)[1]] = s.value
    return out


def lag_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Lag figures of the samples taken between two scrapes (warm-up left out)."""
    diff = {k: v - before.get(k, 0.0) for k, v in after.items()}
    total, count = diff.pop("sum", 0.0), diff.pop("count", 0.0)
    buckets = sorted((float(le), n) for le, n in diff.items())

    def quantile(q: float) -> float:  # the bucket bound holding the q-th sample
        return next((le for le, n in buckets if n >= q * count), float("inf"))

    return {
        "samples": count,
        "mean_ms": 1000 * total / count if count else float("nan"),
        "p50_le_ms": 1000 * quantile(0.5),
        "p99_le_ms": 1000 * quantile(0.99),
        "share_over_10ms": 1 - next((n for le, n in buckets if le == 0.01), 0.0) / count if count else float("nan"),
    }


def start_spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling `pid` at 200 Hz into `out` (raw collapsed stacks) until stop_spy."""
    return subprocess.Popen(
        [
            str(Path(sys.executable).with_name("py-spy")),
            "record",
            "--pid",
            str(pid),
            "--rate",
            "200",
            "--format",
            "raw",
            "--nonblocking",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_spy(spy: subprocess.Popen[bytes] | None) -> None:
    if spy is not None:
        spy.send_signal(2)  # SIGINT: py-spy writes what it has
        spy.wait(timeout=60)
