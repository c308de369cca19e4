"""Run a command with a custom CPU slice: `python -m kvgate.tools.bench.sliced US -- CMD ...`.

The benches start every router (kvgate's and the anchors') through this, so each gets the same
slice (`kvgate bench vllm --router-slice-us`): the slice is set on this process, which then
execs CMD (an exec keeps it, and every thread CMD starts inherits it). Exits 2 with the reason
when the kernel does not take it: a run asked for a slice must not run without one.
"""

from __future__ import annotations

import os
import subprocess
import sys

from kvgate.middleware.server.cpu_slice import set_cpu_slice


def refused(us: int) -> str | None:
    """Why a command could not be run with a `us` µs slice here (None: it can), found by running
    `true` through this launcher, so the caller's own slice stays as it is."""
    done = subprocess.run(
        [sys.executable, "-m", "kvgate.tools.bench.sliced", str(us), "--", "true"], capture_output=True, text=True
    )
    return None if done.returncode == 0 else (done.stderr.strip().removeprefix("sliced: ") or f"exit {done.returncode}")


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python -m kvgate.tools.bench.sliced US -- CMD [ARG ...]", file=sys.stderr)
        return 2
    try:
        refused = set_cpu_slice(int(argv[0]))
    except ValueError as exc:
        refused = str(exc)
    if refused:
        print(f"sliced: {refused}", file=sys.stderr)
        return 2
    os.execvp(argv[2], argv[2:])
    return 0  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
