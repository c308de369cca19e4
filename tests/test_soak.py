"""The short soak (`make test`): real `kvgate serve` + fake backend processes, mixed load,
zero errors and wrong answers, bounded RSS / fds, cache within its entry and byte budgets.
The full run is `make bench-soak` (20,000 requests); figures in docs/RELIABILITY.md."""

from __future__ import annotations

from pathlib import Path

from kvgate.middleware.cli import build_parser
from kvgate.tools.bench import soak


def test_short_soak_through_a_real_proxy(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "bench",
            "soak",
            "--requests",
            "300",
            "--concurrency",
            "32",
            "--max-entries",
            "120",
            "--max-bytes",
            "250000",
            "--workdir",
            str(tmp_path),
        ]
    )
    result = soak.run(args)
    counts = result["load"]["counts"]
    assert result["ok"], (result["checks"], result["load"]["problems"])
    assert counts["served_miss"] and counts["served_exact"] and counts["served_semantic"], counts
    assert counts["stream"] and counts["json"]
    assert result["cache"][0]["entries"] <= 120 and result["cache"][0]["bytes"] <= 250000
