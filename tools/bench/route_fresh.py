"""`kvgate bench route-fresh`: how long a new long prompt waits for its routing decision.

Either mode (`--mode`), deferred as `kvgate serve` routes (approximate mode's records, precise
mode's in-flight view): `prepare` (render, tokenise,
hash and match: the worker thread's step) then `plan` and `choose` on the caller's thread, for
prompts no replica holds, at several lengths. Two routers over one prefix index, in the same run
and alternated prompt by prompt: one matches a long new message on a lead of it (kvgate's
default, kvgate.index.kv.prompt), the other tokenises the message whole first (its hasher's
`leads` off: what kvgate did before leads). Also timed, after the decision: `complete()`, the
tokenising and hashing the recorder thread does later, so the time moved off the request's path
is shown next to what both ways cost in all. Every lead prompt's completed hashes are checked
against an eager hashing of the same prompt.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from kvgate.index.kv.hashing import block_hashes
from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.kv.prompt import PromptHasher
from kvgate.index.kv.tokenizer import load_tokenizer
from kvgate.middleware.config import PrefixConfig, ReplicaConfig, RoutingConfig
from kvgate.middleware.routing.router import Router
from kvgate.tools.bench.route_overhead import WORDS
from kvgate.tools.bench.stats import pct, write_json

ARMS = ("lead", "whole")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokens", default="1000,4000,16000,64000", help="approximate prompt lengths, comma-separated")
    p.add_argument("--samples", type=int, default=30, help="prompts per length and arm")
    p.add_argument("--tokenizer", default="smollm2")
    p.add_argument("--block-size", type=int, default=16, help="tokens per block (vLLM's default on GPUs: 16)")
    p.add_argument("--mode", choices=("approximate", "precise"), default="approximate", help="the routes' prefix mode")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--indexed-blocks", type=int, default=200_000, help="unrelated blocks held across the replicas")
    p.add_argument("--json", type=Path, default=None)


def fresh_text(tokens: int, rng: random.Random) -> str:
    """About `tokens` tokens of text no replica holds: common words, numbers and punctuation."""
    parts: list[str] = []
    for _ in range(tokens * 3 // 4):
        roll = rng.random()
        parts.append(str(rng.randrange(10_000)) if roll < 0.08 else rng.choice(WORDS) + ("," if roll > 0.95 else ""))
    return " ".join(parts)


def lengths(spec: str) -> list[int]:
    try:
        out = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) <= 0:
        raise SystemExit(f"--tokens {spec!r}: positive integers separated by commas")
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(11)
    tokenizer = load_tokenizer(args.tokenizer)
    prefix = PrefixConfig(mode=args.mode, tokenizer=args.tokenizer, block_size=args.block_size)
    cfg = RoutingConfig(policy="cache_aware", prefix=prefix)
    replicas = [ReplicaConfig(name=f"r{i}", api_base=f"http://127.0.0.1:{9100 + i}/v1") for i in range(args.replicas)]
    index = PrefixIndex(args.indexed_blocks * 2)
    per = args.indexed_blocks // args.replicas
    for r in replicas:
        index.add_replica(r.name)
        chains: list[int] = []
        while len(chains) < per:
            chains += block_hashes(
                [rng.randrange(49152) for _ in range(4096)], args.block_size, extra=(r.name, len(chains))
            )
        index.stored(r.name, chains[:per])
    hashers = {arm: PromptHasher(tokenizer, args.block_size) for arm in ARMS}
    hashers["whole"].leads = False
    eager = PromptHasher(tokenizer, args.block_size)
    routers = {arm: Router(replicas, cfg, index=index, defer_records=True, name=arm) for arm in ARMS}
    for arm, router in routers.items():
        router.planner.hasher = hashers[arm]  # precise mode builds its own from the configured tokenizer
    for arm in ARMS:  # first-call costs (the tokenizer's, the index's) before anything is timed
        warm = [{"role": "user", "content": fresh_text(2000, rng)}]
        routers[arm].prepare(warm)
        routers[arm].choose(routers[arm].plan(warm))
    rows, mismatches = [], 0
    try:
        for tokens in lengths(args.tokens):
            got: dict[str, dict[str, list[float]]] = {arm: {"decide": [], "complete": []} for arm in ARMS}
            prompt_tokens = []
            for s in range(args.samples):
                for arm in ARMS if s % 2 == 0 else ARMS[::-1]:
                    msgs = [
                        {"role": "system", "content": f"You are assistant number {rng.randrange(10**9)}."},
                        {"role": "user", "content": fresh_text(tokens, rng)},
                    ]
                    router = routers[arm]
                    t0 = time.perf_counter()
                    router.prepare(msgs)
                    plan = router.plan(msgs)
                    router.choose(plan)
                    t1 = time.perf_counter()
                    assert plan.prompt is not None
                    plan.prompt.complete()
                    t2 = time.perf_counter()
                    got[arm]["decide"].append(t1 - t0)
                    got[arm]["complete"].append(t2 - t1)
                    if arm == "lead":
                        whole = eager.prompt(msgs)
                        mismatches += (plan.prompt.hashes, plan.prompt.tokens) != (whole.hashes, whole.tokens)
                        prompt_tokens.append(whole.tokens)
            row: dict[str, Any] = {"tokens": round(statistics.fmean(prompt_tokens))}
            for arm in ARMS:
                decide, complete = got[arm]["decide"], got[arm]["complete"]
                row[arm] = {
                    "decide_p50_ms": statistics.median(decide) * 1e3,
                    "decide_mean_ms": statistics.fmean(decide) * 1e3,
                    "decide_p99_ms": pct(decide, 0.99) * 1e3,
                    "complete_mean_ms": statistics.fmean(complete) * 1e3,
                    "total_mean_ms": (statistics.fmean(decide) + statistics.fmean(complete)) * 1e3,
                }
            row["decide_ratio_p50"] = row["lead"]["decide_p50_ms"] / row["whole"]["decide_p50_ms"]
            rows.append(row)
            print(
                f"{row['tokens']:>7} tokens: decision p50 lead {row['lead']['decide_p50_ms']:.2f} ms, whole "
                f"{row['whole']['decide_p50_ms']:.2f} ms ({row['decide_ratio_p50']:.2f}x); all work mean lead "
                f"{row['lead']['total_mean_ms']:.2f}, whole {row['whole']['total_mean_ms']:.2f} ms",
                file=sys.stderr,
            )
    finally:
        for router in routers.values():
            router.close()
    return {
        "rows": rows,
        "samples": args.samples,
        "tokenizer": args.tokenizer,
        "block_size": args.block_size,
        "mode": args.mode,
        "replicas": args.replicas,
        "indexed_blocks": index.blocks("r0") * args.replicas,
        "lead_hash_mismatches": mismatches,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
    }


def main(args: argparse.Namespace) -> int:
    result = run(args)
    print("tokens   decision p50 ms (lead / whole)   all work mean ms (lead / whole)")
    for row in result["rows"]:
        lead, whole = row["lead"], row["whole"]
        print(
            f"{row['tokens']:>7}   {lead['decide_p50_ms']:8.2f} / {whole['decide_p50_ms']:8.2f}"
            f"   {lead['total_mean_ms']:8.2f} / {whole['total_mean_ms']:8.2f}"
        )
    if result["lead_hash_mismatches"]:
        print(f"{result['lead_hash_mismatches']} lead prompts completed to other hashes than an eager hashing")
    write_json(args.json, result)
    return 1 if result["lead_hash_mismatches"] else 0
