"""One policy's run in `kvgate bench e2e`: fresh replicas and a proxy configured for the policy, the
conversations through it, and the policy's summary from the replicas' /stats before and after."""

from __future__ import annotations

import argparse
import shutil
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from kvgate.tools.bench.e2e_turns import Turn, arrivals, converse
from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv
from kvgate.tools.bench.stats import pct


def proxy_config(
    policy: str, replicas: list[str], events: list[str], chunk_tokens: int, cache_dir: Path
) -> dict[str, Any]:
    precise = policy == "cache_aware"
    routing = {
        "policy": policy.removesuffix("_approximate"),
        "max_attempts": 2,
        "prefix": {"block_size": chunk_tokens, "tokenizer": "smollm2", "mode": "precise" if precise else "approximate"},
    }
    reps: list[dict[str, Any]] = [{"name": f"r{i}", "api_base": f"{u}/v1"} for i, u in enumerate(replicas)]
    if precise:
        for r, e in zip(reps, events):
            r["events"] = e
    return {
        "cache_dir": str(cache_dir),
        "routes": [
            {
                "name": "e2e",
                "model": "*",
                "backend": {"model": "openai/smollm2", "api_key": "none", "timeout": 600},
                "exact": False,
                "semantic": {"enabled": False},  # every turn must reach a replica
                "replicas": reps,
                "routing": routing,
            }
        ],
    }


def _stats(urls: list[str]) -> list[dict[str, Any]]:
    """Each replica's /stats (cumulative counters)."""
    return [httpx.get(f"{u}/stats", timeout=30).json() for u in urls]


def run_policy(
    policy: str, args: argparse.Namespace, firsts: list[list[dict[str, str]]], work: Path, threads: int, log: Any
) -> tuple[dict[str, Any], list[Turn]]:
    """Fresh replicas and proxy for `policy`, the conversations, a summary; processes stopped after."""
    pdir = work / policy
    pdir.mkdir(parents=True)
    procs: list[Proc] = []
    urls, events = [], []
    try:
        t0 = time.perf_counter()
        for i in range(args.replicas):
            port = free_port()
            events.append(f"tcp://127.0.0.1:{free_port()}")
            argv = kvgate_argv(
                "replica",
                "--port",
                str(port),
                "--name",
                f"r{i}",
                "--kv-dir",
                str(pdir / f"kv-r{i}"),
                "--kv-ram-mb",
                str(args.kv_ram_mb),
                "--kv-disk-mb",
                str(args.kv_disk_mb),
                "--kv-tail-mb",
                str(args.kv_tail_mb),
                "--chunk-tokens",
                str(args.chunk_tokens),
                "--events-endpoint",
                events[-1],
                "--threads",
                str(threads),
                "--log-level",
                "warning",
                *(["--exact-prefill"] if args.exact_prefill else []),
            )
            procs.append(Proc(f"{policy}-replica-r{i}", argv, pdir, env={"TOKENIZERS_PARALLELISM": "false"}))
            urls.append(f"http://127.0.0.1:{port}")
        cfg = pdir / "kvgate.yaml"
        cfg.write_text(yaml.safe_dump(proxy_config(policy, urls, events, args.chunk_tokens, pdir / "cache")))
        port = free_port()
        proxy = Proc(
            f"{policy}-proxy",
            kvgate_argv("serve", "--config", str(cfg), "--port", str(port), "--log-level", "warning"),
            pdir,
            env={"TOKENIZERS_PARALLELISM": "false"},
        )
        procs.append(proxy)
        for proc, url in zip(procs, [*urls, f"http://127.0.0.1:{port}"]):
            proc.wait_http(f"{url}/health", timeout=300)
        startup = time.perf_counter() - t0
        log(
            f"{policy}: {args.replicas} replicas + proxy up in {startup:.1f}s; {args.conversations} conversations × {args.turns} turns"
        )
        before = _stats(urls)
        records: list[Turn] = []
        barrier = threading.Barrier(args.conversations)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        starts = arrivals(args.conversations, args.arrival_s, args.seed)
        workers = [
            threading.Thread(
                target=converse,
                args=(
                    url,
                    i,
                    firsts[i],
                    args.turns,
                    args.max_tokens,
                    args.think_s,
                    args.seed,
                    barrier,
                    records,
                    starts[i],
                ),
                daemon=True,
            )
            for i in range(args.conversations)
        ]
        t_run = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wall = time.perf_counter() - t_run
        after = _stats(urls)
    finally:
        for proc in reversed(procs):
            proc.stop()
        for kv in pdir.glob("kv-r*"):
            shutil.rmtree(kv, ignore_errors=True)

    summary = policy_summary(policy, records, before, after, args.conversations * args.turns, args.turns, startup, wall)
    return summary, sorted(records, key=lambda r: (r.conversation, r.turn))


def policy_summary(
    policy: str,
    records: list[Turn],
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
    planned: int,
    turns: int,
    startup_s: float,
    wall_s: float,
) -> dict[str, Any]:
    """A policy's figures from its turns and the replicas' /stats before and after (pure): TTFTs of
    the completed turns, prompt/cached token deltas summed over replicas, where follow-ups landed.
    `planned` is conversations × turns; turns never sent (a conversation stops at its first error)
    are `not_sent`."""

    def delta(key: str) -> list[float]:
        return [a[key] - b[key] for a, b in zip(after, before)]

    prompt, cached = sum(delta("prompt_tokens")), sum(delta("cached_tokens"))
    ok = [r for r in records if r.error is None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    by_turn = [[r.ttft_s for r in ok if r.turn == t and r.ttft_s is not None] for t in range(turns)]
    summary = {
        "router": f"kvgate {policy.removesuffix('_approximate')} ({'precise: KV events' if policy == 'cache_aware' else 'approximate'})",
        "requests": len(records),
        "completed": len(ok),
        "errors": len(records) - len(ok),
        "not_sent": planned - len(records),
        "error_samples": [r.error for r in records if r.error][:3],
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else float("nan"),
        "ttft_p50_s": pct(ttfts, 0.5),
        "ttft_p99_s": pct(ttfts, 0.99),
        "ttft_by_turn_mean_s": [statistics.fmean(x) if x else None for x in by_turn],
        "ttft_mean_follow_ups_s": statistics.fmean(later) if (later := [x for ts in by_turn[1:] for x in ts]) else None,
        "prompt_tokens": int(prompt),
        "cached_tokens": int(cached),
        "prefill_tokens_computed": int(prompt - cached),
        "hit_rate": cached / prompt if prompt else 0.0,
        "requests_per_replica": [int(x) for x in delta("requests")],
        "replica_prefill_s": [round(x, 3) for x in delta("prefill_s")],
        "replica_load_s": [round(x, 3) for x in delta("load_s")],
        "empty_answers": sum(1 for r in ok if not r.answer),
        "startup_s": startup_s,
        "wall_s": wall_s,
    }
    served = {(r.conversation, r.turn): r.replica for r in ok}
    follow = [served[(c, t)] == served[(c, t - 1)] for (c, t) in served if t and (c, t - 1) in served]
    summary["follow_ups_on_previous_replica"] = sum(follow) / len(follow) if follow else None
    relayed = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    summary["usage_relayed"] = f"{len(relayed)}/{len(ok)}"  # whether the proxy passed cached_tokens through
    return summary
