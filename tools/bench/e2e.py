"""`kvgate bench e2e`: multi-turn conversations through `kvgate serve` over real reference replicas.

Per policy, fresh processes: N `kvgate replica` (SmolLM2-135M on the CPU, each with its own KV
chunk store directory, so where a turn lands decides whether its history is loaded or
prefilled again, and its KV events endpoint) and one `kvgate serve` with a generated config whose
only route has both response-cache tiers off (exact: false, semantic disabled), so every turn
reaches a replica. cache_aware runs in precise mode (the router follows the replicas' KV events);
the other policies in approximate mode.

K conversations run at once, one thread each, all starting together (a burst of cold openings) or,
with --arrival-s, arriving one after another (seeded exponential gaps of that mean, the same
schedule under every policy: the steady state of a service where most requests are follow-ups).
Conversation i opens with a
long, distinct document (between --opening-min-tokens and --opening-max-tokens tokens of
deterministic text, spread over the conversations) and a question, then asks T-1 short follow-ups,
each turn appending the model's (greedy) answer. Before each follow-up the "user" thinks for a
seeded random time, uniform in [0, 2·--think-s], the same schedule under every policy. Without it
the conversations advance in lock step and round_robin's global counter sends each conversation
back to the same replica whenever K is a multiple of the replica count (perfect affinity by
accident), or never when it is not; `follow_ups_on_previous_replica` shows what happened. Every request streams; TTFT is the time from
sending to the first non-empty content chunk as the client sees it (proxy, queueing and
prefill included). Token counts come from the replicas' /stats (after minus before the run):
prefill_tokens_computed = prompt_tokens - cached_tokens, i.e. the prompt tokens some replica had
to prefill because it did not hold their KV. Timings are reported, never judged.

Here: the options, the run over the policies and the summary; the conversations are
kvgate.tools.bench.e2e_turns, one policy's processes and summary kvgate.tools.bench.e2e_policy, the KV sizes
kvgate.tools.bench.e2e_capacity.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvgate.middleware.progress import say
from kvgate.tools.bench.e2e_capacity import kv_bytes_per_token, kv_working_set, store_capacity_mb
from kvgate.tools.bench.e2e_policy import run_policy
from kvgate.tools.bench.e2e_turns import arrivals, openings
from kvgate.tools.bench.machine import hardware_info

__all__ = [
    "POLICIES",
    "add_arguments",
    "arrivals",
    "kv_bytes_per_token",
    "kv_working_set",
    "main",
    "run",
    "store_capacity_mb",
    "validate",
]

POLICIES = ("cache_aware", "round_robin", "least_loaded", "affinity", "cache_aware_approximate")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `kvgate bench e2e`."""
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--conversations", type=int, default=4, help="K conversations, run concurrently")
    p.add_argument("--turns", type=int, default=4, help="T turns per conversation")
    p.add_argument("--max-tokens", type=int, default=16, help="answer length per turn (greedy)")
    p.add_argument("--policies", default="cache_aware,round_robin", help=f"comma list of {','.join(POLICIES)}")
    p.add_argument("--opening-min-tokens", type=int, default=600)
    p.add_argument("--opening-max-tokens", type=int, default=900)
    p.add_argument("--chunk-tokens", type=int, default=256, help="replicas' --chunk-tokens = the router's block_size")
    p.add_argument("--kv-ram-mb", type=int, default=256, help="each replica's RAM tier")
    p.add_argument("--kv-disk-mb", type=int, default=1024, help="each replica's disk tier")
    p.add_argument(
        "--kv-tail-mb",
        type=int,
        default=256,
        help="each replica's RAM for the partial chunk after the last full one (spilled to disk)",
    )
    p.add_argument(
        "--replica-threads", type=int, default=None, help="torch threads per replica (default: CPUs / replicas)"
    )
    p.add_argument("--exact-prefill", action="store_true", help="pass --exact-prefill to the replicas")
    p.add_argument(
        "--think-s",
        type=float,
        default=0.5,
        help="mean pause before a follow-up (seeded uniform in [0, 2x]; 0 = lock step, see above)",
    )
    p.add_argument(
        "--arrival-s",
        type=float,
        default=0.0,
        help="mean gap between conversation starts (seeded exponential; 0 = all start together)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the think times and arrivals")
    p.add_argument("--dir", type=Path, default=None, help="where the work directory (logs, KV stores) goes")
    p.add_argument("--json", type=Path, default=None)


def validate(args: argparse.Namespace) -> list[str]:
    """Problems with the options, as messages (empty when fine)."""
    bad = []
    for name in ("replicas", "conversations", "turns", "chunk_tokens"):
        if getattr(args, name) < 1:
            bad.append(f"--{name.replace('_', '-')} must be >= 1")
    if not 1 <= args.max_tokens <= 4096:
        bad.append("--max-tokens must be between 1 and 4096")
    if not 1 <= args.opening_min_tokens <= args.opening_max_tokens <= 6000:
        bad.append("need 1 <= --opening-min-tokens <= --opening-max-tokens <= 6000")
    if args.kv_ram_mb < 0 or args.kv_disk_mb < 0 or args.kv_ram_mb + args.kv_disk_mb == 0:
        bad.append("--kv-ram-mb and --kv-disk-mb must be >= 0, not both 0")
    if args.kv_tail_mb < 0:
        bad.append("--kv-tail-mb must be >= 0")
    if args.replica_threads is not None and args.replica_threads < 1:
        bad.append("--replica-threads must be >= 1")
    if args.think_s < 0:
        bad.append("--think-s must be >= 0")
    if args.arrival_s < 0:
        bad.append("--arrival-s must be >= 0")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if not policies or unknown:
        bad.append(f"--policies: unknown {unknown or 'empty list'}; choose from {','.join(POLICIES)}")
    if len(set(policies)) != len(policies):
        bad.append("--policies: a policy is listed twice")
    return bad


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every policy of --policies in turn, fresh processes each; returns the JSON-ready result."""
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    threads = args.replica_threads or max(1, (os.cpu_count() or 2) // args.replicas)
    log = say("e2e")
    t_start = time.perf_counter()
    first = openings(args.conversations, args.opening_min_tokens, args.opening_max_tokens)
    log(f"openings: {[n for _, n in first]} prompt tokens")
    work = Path(tempfile.mkdtemp(prefix="kvgate-e2e-", dir=args.dir))
    result: dict[str, Any] = {
        "replicas": args.replicas,
        "conversations": args.conversations,
        "turns": args.turns,
        "max_tokens": args.max_tokens,
        "opening_tokens": [n for _, n in first],
        "chunk_tokens": args.chunk_tokens,
        "kv_ram_mb": args.kv_ram_mb,
        "kv_disk_mb": args.kv_disk_mb,
        "kv_tail_mb": args.kv_tail_mb,
        "replica_threads": threads,
        "exact_prefill": args.exact_prefill,
        "think_s": args.think_s,
        "arrival_s": args.arrival_s,
        "seed": args.seed,
        "machine": hardware_info(work),
        "policies": {},
        "requests_detail": {},
    }
    answers: dict[str, dict[tuple[int, int], str]] = {}
    for policy in policies:
        summary, records = run_policy(policy, args, [m for m, _ in first], work, threads, log)
        result["policies"][policy] = summary
        result["requests_detail"][policy] = [{k: v for k, v in asdict(r).items() if k != "answer"} for r in records]
        answers[policy] = {(r.conversation, r.turn): r.answer for r in records if r.error is None}
        log(
            f"{policy}: ttft mean {summary['ttft_mean_s'] * 1000:.0f} ms p50 {summary['ttft_p50_s'] * 1000:.0f} ms "
            f"p99 {summary['ttft_p99_s'] * 1000:.0f} ms, prefilled {summary['prefill_tokens_computed']} of "
            f"{summary['prompt_tokens']} prompt tokens, errors {summary['errors']}"
        )
    ca, rr = result["policies"].get("cache_aware"), result["policies"].get("round_robin")
    if ca and rr and rr["ttft_mean_s"] > 0:
        result["ttft_mean_ratio_cache_aware_over_round_robin"] = ca["ttft_mean_s"] / rr["ttft_mean_s"]
        if ca["ttft_mean_follow_ups_s"] is not None and rr["ttft_mean_follow_ups_s"]:
            result["ttft_mean_follow_ups_ratio_cache_aware_over_round_robin"] = (
                ca["ttft_mean_follow_ups_s"] / rr["ttft_mean_follow_ups_s"]
            )
        result["prefill_tokens_ratio_cache_aware_over_round_robin"] = (
            ca["prefill_tokens_computed"] / rr["prefill_tokens_computed"] if rr["prefill_tokens_computed"] else None
        )
    detail = next(iter(result["requests_detail"].values()), [])
    if detail:  # which regime this run was in: can each replica hold every conversation?
        from kvgate.engines.replica.model import resolve_model_dir

        config = json.loads((resolve_model_dir("smollm2") / "config.json").read_text())
        ws = kv_working_set(detail, args.max_tokens, args.chunk_tokens, kv_bytes_per_token(config))
        result["kv_working_set_mb"] = round(ws / 1e6, 1)
        result["kv_store_mb_per_replica"] = store_capacity_mb(args.kv_ram_mb, args.kv_disk_mb)
    if len(answers) > 1:  # greedy: the same conversations should get the same answers under any routing
        keys = set.intersection(*(set(a) for a in answers.values()))
        result["same_answers_across_policies"] = all(len({a[k] for a in answers.values()}) == 1 for k in keys)
    result["logs"] = str(work)
    result["wall_s"] = time.perf_counter() - t_start
    return result


def main(args: argparse.Namespace) -> int:
    problems = validate(args)
    if problems:
        for msg in problems:
            print(f"kvgate bench e2e: error: {msg}", file=sys.stderr)
        return 2
    result = run(args)
    print(
        f"{args.conversations} conversations × {args.turns} turns over {args.replicas} replicas "
        f"(openings {min(result['opening_tokens'])}-{max(result['opening_tokens'])} tokens, {args.max_tokens} tokens per answer)"
    )
    print(
        f"{'policy':24s} {'ttft mean':>10s} {'p50':>8s} {'p99':>8s} {'prefilled':>10s} {'cached':>8s} {'prompt':>8s} {'errors':>6s}"
    )
    for name, s in result["policies"].items():
        print(
            f"{name:24s} {s['ttft_mean_s'] * 1000:8.0f}ms {s['ttft_p50_s'] * 1000:6.0f}ms {s['ttft_p99_s'] * 1000:6.0f}ms "
            f"{s['prefill_tokens_computed']:10d} {s['cached_tokens']:8d} {s['prompt_tokens']:8d} {s['errors']:6d}"
        )
    if "kv_working_set_mb" in result:
        print(
            f"KV of all conversations at their end: {result['kv_working_set_mb']:.0f} MB; each replica's store "
            f"holds {result['kv_store_mb_per_replica']} MB (tiers are write-through: the largest tier bounds it)"
        )
    if "ttft_mean_ratio_cache_aware_over_round_robin" in result:
        print(f"ttft mean cache_aware / round_robin: {result['ttft_mean_ratio_cache_aware_over_round_robin']:.2f}")
    if "ttft_mean_follow_ups_ratio_cache_aware_over_round_robin" in result:
        print(
            f"ttft mean of follow-up turns (2..T) cache_aware / round_robin: "
            f"{result['ttft_mean_follow_ups_ratio_cache_aware_over_round_robin']:.2f}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if any(s["errors"] or s["not_sent"] for s in result["policies"].values()) else 0
