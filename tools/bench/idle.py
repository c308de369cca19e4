"""What an idle `kvgate serve` costs: CPU ms per second and wake-ups per second with nothing sent.

    kvgate bench idle [--seconds 60] [--replicas 2] [--rounds 2] [--trees DIR,DIR] [--json FILE]

A proxy in front of `--replicas` demo backends (routed relay, cache_aware, the exact tier on), three
requests to warm it, a few seconds to settle, then its threads' time on a CPU (the scheduler's
nanosecond counts) and their voluntary context switches over `--seconds`. Every timer, poll and
background read shows here; a fleet of proxies pays it on every machine, and on a machine the
proxy shares with its engines it is taken from them.

`--trees`: source trees to compare (each a directory holding `kvgate/`, e.g. a `git worktree` of
another commit), run alternately round by round, each proxy started from a directory of its own
so the tree on PYTHONPATH is the one imported. Default: the installed code alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from kvgate.middleware.progress import say
from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv
from kvgate.tools.bench.vllm_arena_cpu import status_count, tree_on_cpu_s, tree_task_files

SETTLE_S = 4.0  # after the warm-up requests: longer than the loop-lag watcher's busy second


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=60.0, help="length of each idle window")
    p.add_argument("--replicas", type=int, default=2, help="demo backends behind the proxy")
    p.add_argument("--rounds", type=int, default=2, help="windows per tree, trees alternating")
    p.add_argument("--trees", default="", help="comma list of source trees to compare (default: the installed code)")
    p.add_argument("--json", type=Path, default=None)


def switches(pids: list[int]) -> int:
    """Voluntary context switches of every thread of the trees under `pids` (a thread that
    sleeps and wakes counts one per wake-up)."""
    return sum(status_count(text, "voluntary_ctxt_switches") for (text,) in tree_task_files(pids, "status"))


def proxy_config(work: Path, bases: list[str]) -> dict[str, Any]:
    return {
        "cache_dir": str(work / "cache"),
        "routes": [
            {
                "name": "bench",
                "model": "bench-*",
                "backend": {"model": "openai/fake", "api_key": "none", "timeout": 60},
                "exact": True,
                "semantic": {"enabled": False},
                "replicas": [{"name": f"r{i}", "api_base": base} for i, base in enumerate(bases)],
                "routing": {"forward": "relay", "policy": "cache_aware", "prefix": {"tokenizer": "text"}},
            }
        ],
    }


def one_window(tree: str, bases: list[str], seconds: float, work: Path) -> dict[str, Any]:
    """Start a proxy from `tree` ("" = installed), warm it, settle, measure, stop it."""
    work.mkdir(parents=True)
    config = work / "kvgate.yaml"
    config.write_text(yaml.safe_dump(proxy_config(work, bases)))
    port = free_port()
    env = {"PYTHONPATH": tree} if tree else None
    proxy = Proc("proxy", kvgate_argv("serve", "--config", str(config), "--port", str(port)), work, env=env, cwd=work)
    try:
        proxy.wait_http(f"http://127.0.0.1:{port}/health")
        for i in range(3):
            body = {"model": "bench-1", "messages": [{"role": "user", "content": f"warm-up {i}"}]}
            httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30).raise_for_status()
        time.sleep(SETTLE_S)
        pids = [proxy.proc.pid]
        cpu0, sw0, t0 = tree_on_cpu_s(pids), switches(pids), time.perf_counter()
        time.sleep(seconds)
        cpu1, sw1, wall = tree_on_cpu_s(pids), switches(pids), time.perf_counter() - t0
    finally:
        proxy.stop()
    return {
        "tree": tree or "installed",
        "cpu_ms_per_s": round((cpu1 - cpu0) * 1000 / wall, 3),
        "wakeups_per_s": round((sw1 - sw0) / wall, 1),
        "seconds": round(wall, 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    trees = [t.strip() for t in args.trees.split(",") if t.strip()] or [""]
    for tree in trees:
        if tree and not (Path(tree) / "kvgate").is_dir():
            raise SystemExit(f"kvgate bench idle: --trees: {tree} holds no kvgate/ directory")
    log = say("idle")
    work = Path(tempfile.mkdtemp(prefix="kvgate-idle-"))
    backends, bases = [], []
    for i in range(args.replicas):
        port = free_port()
        backend = Proc(f"backend-{i}", kvgate_argv("demo-backend", "--port", str(port)), work)
        backends.append(backend)
        backend.wait_http(f"http://127.0.0.1:{port}/health")
        bases.append(f"http://127.0.0.1:{port}/v1")
    windows = []
    try:
        for r in range(args.rounds):
            for t, tree in enumerate(trees):
                row = one_window(tree, bases, args.seconds, work / f"round{r}-tree{t}")
                log(f"round {r + 1} {row['tree']}: {row['cpu_ms_per_s']} ms/s, {row['wakeups_per_s']} wake-ups/s")
                windows.append({"round": r + 1, **row})
    finally:
        for backend in backends:
            backend.stop()
    summary = {}
    for label in dict.fromkeys(w["tree"] for w in windows):  # every tree ran `rounds` windows
        mine = [w for w in windows if w["tree"] == label]
        summary[label] = {
            "cpu_ms_per_s_mean": round(statistics.fmean(w["cpu_ms_per_s"] for w in mine), 3),
            "wakeups_per_s_mean": round(statistics.fmean(w["wakeups_per_s"] for w in mine), 1),
        }
    return {"replicas": args.replicas, "seconds": args.seconds, "windows": windows, "summary": summary}


def main(args: argparse.Namespace) -> int:
    if args.seconds <= 0 or args.replicas < 1 or args.rounds < 1:
        print("kvgate bench idle: --seconds, --replicas and --rounds must be positive", flush=True)
        return 2
    result = run(args)
    for tree, row in result["summary"].items():
        print(f"{tree}: {row['cpu_ms_per_s_mean']} ms of CPU per second idle, {row['wakeups_per_s_mean']} wake-ups/s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0
