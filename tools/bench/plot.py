"""`kvgate bench plot KIND RESULT.json --out FILE.png`: a figure from a saved benchmark result
(tools/bench/plots.py), without re-running the benchmark; and the `--plot FILE.png` option that
`kvgate bench semantic | routing | kv` share. matplotlib is imported only when a plot is drawn."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

KINDS = ("kv", "routing", "semantic")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=KINDS, help="which benchmark's result")
    p.add_argument("result", type=Path, metavar="RESULT.json", help="what `kvgate bench KIND --json` wrote")
    p.add_argument("--out", type=Path, required=True, metavar="FILE.png")


def add_plot_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--plot", type=Path, default=None, metavar="FILE.png", help="also draw the result as a PNG (matplotlib)"
    )


def write_plot(kind: str, out: Path | None, result: dict[str, Any]) -> int:
    """Draw `result` to `out` when one was asked for; 0, or 2 with a message naming the problem."""
    if out is None:
        return 0
    from kvgate.tools.bench.plots import PlotInputError, save_plot

    try:
        save_plot(kind, result, out)
    except (OSError, PlotInputError) as exc:
        print(f"kvgate bench {kind}: --plot: {exc}", file=sys.stderr)
        return 2
    print(f"plot written to {out}")
    return 0


def main(args: argparse.Namespace) -> int:
    """0 on success; 2 with a message for a missing, unreadable or wrong file."""
    try:
        result = json.loads(args.result.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"kvgate bench plot: error: {args.result}: {exc}", file=sys.stderr)
        return 2
    return write_plot(args.kind, args.out, result)
