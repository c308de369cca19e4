"""What a process of one kvgate part loads: import time, modules, peak RSS, heavy packages.

    python -m kvgate.tools.bench.footprint [--tree DIR] [--repeat N] MODULE [MODULE ...]
    python -m kvgate.tools.bench.footprint [--tree DIR] --sim-replica

Each measurement runs in a fresh interpreter. `--tree DIR` measures another checkout (say an older
commit in a git worktree) with the same interpreter, so two layouts compare in one run.
`--sim-replica` starts `kvgate sim-replica`, times it to its first 200 on /health and reads its RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from kvgate.tools.bench.procs import free_port

HEAVY = ("litellm", "faiss", "onnxruntime", "torch", "sentence_transformers", "fastapi")
PROBE = """
import importlib, json, resource, sys, time
t = time.perf_counter()
importlib.import_module(sys.argv[1])
print(json.dumps({"import_s": time.perf_counter() - t, "modules": len(sys.modules),
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "heavy": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def import_footprint(module: str, tree: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module], cwd=tree, env=_env(tree), capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise SystemExit(f"importing {module} in {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def sim_replica_footprint(tree: Path, timeout_s: float = 60.0) -> dict[str, float]:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "kvgate.middleware.cli",
        "sim-replica",
        "--port",
        str(port),
        "--name",
        "s",
        "--capacity-tokens",
        "100000",
        "--prefill-tps",
        "10000",
        "--decode-tps",
        "100",
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=tree, env=_env(tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - started < timeout_s:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                    return {
                        "ready_s": time.perf_counter() - started,
                        "rss_mb": psutil.Process(proc.pid).memory_info().rss / 2**20,
                    }
            except httpx.HTTPError:
                time.sleep(0.05)
        raise SystemExit(f"sim-replica from {tree} did not answer within {timeout_s:.0f}s")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvgate.tools.bench.footprint", description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*")
    p.add_argument("--tree", type=Path, default=Path.cwd(), help="checkout to measure (default: here)")
    p.add_argument("--repeat", type=int, default=3, help="runs per measurement; medians are printed")
    p.add_argument("--sim-replica", action="store_true", help="also start `kvgate sim-replica` and measure it")
    args = p.parse_args(argv)
    tree = args.tree.resolve()
    for module in args.modules:
        runs = [import_footprint(module, tree) for _ in range(args.repeat)]
        print(
            f"{tree.name}\t{module}\timport {statistics.median(r['import_s'] for r in runs):.3f} s\t"
            f"{runs[0]['modules']} modules\tpeak RSS {statistics.median(r['max_rss_mb'] for r in runs):.0f} MB\t"
            f"loads: {', '.join(runs[0]['heavy']) or '-'}"
        )
    if args.sim_replica:
        runs = [sim_replica_footprint(tree) for _ in range(args.repeat)]
        print(
            f"{tree.name}\tkvgate sim-replica\tready {statistics.median(r['ready_s'] for r in runs):.2f} s\t"
            f"RSS {statistics.median(r['rss_mb'] for r in runs):.0f} MB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
