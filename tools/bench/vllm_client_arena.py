"""`kvgate bench vllm-client`: vLLM's own benchmark client, default backend (`/v1/completions`),
through each router in front of the two real vLLM servers of `kvgate bench vllm`.

Per run and arm: a fresh router process (the arms and their start-up are `kvgate bench vllm`'s:
tools/bench/vllm_arena_bench.py's Bench), both engines' prefix caches emptied, then one `vllm bench serve`
run (tools/bench/vllm_bench_client.py) with `--dataset-name prefix_repetition` (prompts that share
one of a few long prefixes, then a unique suffix) and the same seed in every run, so every arm sees
the same prompts. Runs interleave the arms. Reported per arm: the client's own completed / failed
counts and its TTFT (mean over runs of each run's mean, 95% interval; median; p99), request
throughput, and the engines' cached fraction (vLLM's counters before and after). The anchors run at
the thresholds given (`--anchor-params`, default: those the completions routing bench tuned on its
tuning conversations, none of them in this workload).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvgate.engines.vllm.launch import vllm_python
from kvgate.middleware.progress import say
from kvgate.tools.bench.arena_table import mean_interval
from kvgate.tools.bench.machine import machine_info
from kvgate.tools.bench.stats import write_json
from kvgate.tools.bench.vllm_arena import parse_arms
from kvgate.tools.bench.vllm_arena_bench import Bench
from kvgate.tools.bench.vllm_arena_setup import ANCHOR_OF, MODEL, preflight
from kvgate.tools.bench.vllm_arena_stats import counters
from kvgate.tools.bench.vllm_bench_client import run_vllm_bench

ARMS = ("kvgate_precise", "sglang", "vllm_router")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", type=Path, required=True, help="where the result goes")
    p.add_argument("--arms", default=",".join(ARMS), help="comma list of kvgate bench vllm's arms")
    p.add_argument("--runs", type=int, default=3, help="runs per arm (cold engine caches each)")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--prefix-len", type=int, default=512, help="tokens of each shared prefix")
    p.add_argument("--suffix-len", type=int, default=64, help="tokens after it, unique per prompt")
    p.add_argument("--num-prefixes", type=int, default=4)
    p.add_argument("--output-len", type=int, default=8)
    p.add_argument("--max-concurrency", type=int, default=4)
    p.add_argument(
        "--anchor-params",
        default="0.3/16/1.5",
        metavar="CT/ABS/REL",
        help="the anchors' cache_threshold/balance_abs_threshold/balance_rel_threshold",
    )
    p.add_argument("--dir", type=Path, default=None, help="where the work directory (logs, configs) goes")


def _params(text: str) -> dict[str, float]:
    ct, ab, rel = text.split("/")
    return {"cache_threshold": float(ct), "balance_abs_threshold": int(ab), "balance_rel_threshold": float(rel)}


def _client_args(args: argparse.Namespace) -> list[str]:
    return [
        "--dataset-name",
        "prefix_repetition",
        "--num-prompts",
        str(args.num_prompts),
        "--prefix-repetition-prefix-len",
        str(args.prefix_len),
        "--prefix-repetition-suffix-len",
        str(args.suffix_len),
        "--prefix-repetition-num-prefixes",
        str(args.num_prefixes),
        "--prefix-repetition-output-len",
        str(args.output_len),
        "--request-rate",
        "inf",
        "--max-concurrency",
        str(args.max_concurrency),
        "--seed",
        "0",
    ]


def one_run(bench: Bench, arm: str, args: argparse.Namespace, tag: str) -> dict[str, Any]:
    proc, url, label = bench.router(arm, _params(args.anchor_params) if arm in ANCHOR_OF else {})
    base = url.rsplit("/v1/", 1)[0]
    try:
        bench.reset()
        before = counters(bench.pages())
        t0 = time.perf_counter()
        result = run_vllm_bench(
            str(vllm_python()), base, bench.model_dir, MODEL, _client_args(args), bench.work / f"client-{arm}-{tag}"
        )
        wall = time.perf_counter() - t0
        time.sleep(1.0)  # the engines' last stats reach /metrics
        after = counters(bench.pages())
    finally:
        proc.stop()
    prompt = after["prompt"] - before["prompt"]
    return {
        "router": label,
        "completed": result["completed"],
        "failed": result["failed"],
        "mean_ttft_ms": result["mean_ttft_ms"],
        "median_ttft_ms": result["median_ttft_ms"],
        "p99_ttft_ms": result["p99_ttft_ms"],
        "request_throughput": result["request_throughput"],
        "cached_fraction": (after["cached"] - before["cached"]) / prompt if prompt else None,
        "wall_s": round(wall, 1),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    means = [r["mean_ttft_ms"] for r in runs]
    mean, low, high = mean_interval(means)
    cached = [r["cached_fraction"] for r in runs if r["cached_fraction"] is not None]
    return {
        "router": runs[0]["router"],
        "ttft_mean_ms": round(mean, 1),
        "ttft_mean_ci_ms": round((high - low) / 2, 1),
        "ttft_median_ms": round(statistics.median(r["median_ttft_ms"] for r in runs), 1),
        "ttft_p99_ms": round(statistics.median(r["p99_ttft_ms"] for r in runs), 1),
        "request_throughput": round(statistics.fmean(r["request_throughput"] for r in runs), 3),
        "cached_fraction": round(statistics.fmean(cached), 4) if cached else None,
        "completed": sum(r["completed"] for r in runs),
        "failed": sum(r["failed"] for r in runs),
        "runs": runs,
    }


def main(args: argparse.Namespace) -> int:
    arms = parse_arms(args.arms)
    problems = preflight(arms, Path(__file__))  # this bench reads no trace: any existing path passes that check
    if problems:
        for msg in problems:
            print(f"kvgate bench vllm-client: error: {msg}", file=sys.stderr)
        return 2
    log = say("vllm-client")
    work = Path(tempfile.mkdtemp(prefix="kvgate-vllm-client-", dir=args.dir))
    bench = Bench(argparse.Namespace(kv_connector=False, kv_cache_gib=1, endpoint="completions"), work)
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    bench.start()
    try:
        for i in range(args.runs):
            for arm in arms:
                log(f"run {i + 1}/{args.runs}: {arm}")
                runs[arm].append(one_run(bench, arm, args, f"r{i}"))
    finally:
        bench.stop()
    result = {
        "command": " ".join(sys.argv),
        "machine": machine_info(),
        "endpoint": "completions",
        "client": "vllm bench serve --backend vllm (default)",
        "workload": _client_args(args),
        "anchor_params": args.anchor_params,
        "routers": {a: summarize(r) for a, r in runs.items()},
    }
    write_json(args.json, result)
    for arm, s in result["routers"].items():
        print(
            f"{arm:16} TTFT {s['ttft_mean_ms']:8.1f} ± {s['ttft_mean_ci_ms']:6.1f} ms  median {s['ttft_median_ms']:8.1f}"
            f"  cached {s['cached_fraction']}  completed {s['completed']} failed {s['failed']}"
        )
    return 0
