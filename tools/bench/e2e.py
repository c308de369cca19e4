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
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tools.bench.kv import fit, machine_info, sentences
from tools.bench.procs import Proc, free_port, kvgate_argv
from tools.bench.stats import pct

POLICIES = ("cache_aware", "round_robin", "least_loaded", "affinity", "cache_aware_approximate")
SYSTEM = "You are a careful clerk. Answer briefly from the records."
FOLLOW_UPS = ("Which place is mentioned most often?", "Summarise the records in one sentence.",
              "What was weighed?", "Which record mentions a lighthouse?", "What happened on the latest day?",
              "List two places.", "Was anything lost?", "Give the records a title.")


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--kv-tail-mb", type=int, default=256,
                   help="each replica's RAM for the partial chunk after the last full one (spilled to disk)")
    p.add_argument("--replica-threads", type=int, default=None, help="torch threads per replica (default: CPUs / replicas)")
    p.add_argument("--exact-prefill", action="store_true", help="pass --exact-prefill to the replicas")
    p.add_argument("--think-s", type=float, default=0.5,
                   help="mean pause before a follow-up (seeded uniform in [0, 2x]; 0 = lock step, see above)")
    p.add_argument("--arrival-s", type=float, default=0.0,
                   help="mean gap between conversation starts (seeded exponential; 0 = all start together)")
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


def openings(k: int, lo: int, hi: int) -> list[tuple[list[dict[str, str]], int]]:
    """Per conversation, its first messages and their prompt tokens (SmolLM2's chat template)."""
    from index.tokenizer import load_tokenizer

    tok = load_tokenizer("smollm2")
    out = []
    for i in range(k):
        target = lo + (hi - lo) * i // max(1, k - 1)
        seed = 100 + i

        def build(n: int, seed: int = seed) -> list[dict[str, str]]:
            facts = "\n".join(sentences(seed, n))
            return [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"Here are the records of ledger {seed}:\n{facts}\nWhat does record {seed}.0 say?"}]

        out.append(fit(build, lambda m: len(tok.encode_messages(m)), target, hi=max(4, target // 4)))
    return out


@dataclass
class Turn:
    conversation: int
    turn: int
    ttft_s: float | None = None
    total_s: float | None = None
    replica: str | None = None
    prompt_tokens: int | None = None  # from the usage the proxy relays, when it does
    cached_tokens: int | None = None
    answer: str = ""
    error: str | None = None


def stream_turn(client: httpx.Client, url: str, messages: list[dict[str, str]], max_tokens: int, rec: Turn) -> None:
    """One streamed request; fills `rec` (errors recorded, never raised)."""
    body = {"model": "smollm2", "messages": messages, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "stream_options": {"include_usage": True}}
    parts: list[str] = []
    sent = time.perf_counter()
    try:
        with client.stream("POST", url, json=body) as resp:
            rec.replica = resp.headers.get("x-kvgate-replica")
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {resp.read()[:200]!r}"
                return
            for line in resp.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    rec.error = str(chunk["error"])[:200]
                    return
                for choice in chunk.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if rec.ttft_s is None:
                            rec.ttft_s = time.perf_counter() - sent
                        parts.append(content)
                usage = chunk.get("usage")
                if usage:
                    rec.prompt_tokens = usage.get("prompt_tokens")
                    rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    except (httpx.HTTPError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:200]
        return
    rec.total_s = time.perf_counter() - sent
    if rec.ttft_s is None:  # the first token was EOS: the answer is empty, the first token still came
        rec.ttft_s = rec.total_s
    rec.answer = "".join(parts)


def arrivals(k: int, mean_gap_s: float, seed: int) -> list[float]:
    """Start offsets of k conversations: 0 for the first, then seeded exponential gaps of mean
    `mean_gap_s` (all 0 when it is 0). The same for every policy of a run."""
    if mean_gap_s <= 0:
        return [0.0] * k
    rng, at, out = random.Random(f"{seed}:arrivals"), 0.0, []
    for i in range(k):
        out.append(at)
        at += rng.expovariate(1 / mean_gap_s)
    return out


def converse(url: str, i: int, first: list[dict[str, str]], turns: int, max_tokens: int, think_s: float,
             seed: int, start: threading.Barrier, out: list[Turn], delay_s: float = 0.0) -> None:
    messages = list(first)
    rng = random.Random(f"{seed}:{i}")
    with httpx.Client(timeout=httpx.Timeout(600.0), headers={"authorization": "Bearer e2e"}) as client:
        start.wait()
        if delay_s:
            time.sleep(delay_s)
        for t in range(turns):
            pause = rng.uniform(0, 2 * think_s)
            if t and pause:
                time.sleep(pause)
            rec = Turn(i, t)
            stream_turn(client, url, messages, max_tokens, rec)
            out.append(rec)
            if rec.error is not None:
                return  # the conversation cannot go on without its answer
            messages += [{"role": "assistant", "content": rec.answer},
                         {"role": "user", "content": FOLLOW_UPS[(i + t) % len(FOLLOW_UPS)]}]


def proxy_config(policy: str, replicas: list[str], events: list[str], chunk_tokens: int, cache_dir: Path) -> dict[str, Any]:
    precise = policy == "cache_aware"
    routing = {"policy": policy.removesuffix("_approximate"), "block_size": chunk_tokens, "tokenizer": "smollm2",
               "mode": "precise" if precise else "approximate", "max_attempts": 2}
    reps: list[dict[str, Any]] = [{"name": f"r{i}", "api_base": f"{u}/v1"} for i, u in enumerate(replicas)]
    if precise:
        for r, e in zip(reps, events):
            r["events"] = e
    return {
        "cache_dir": str(cache_dir),
        "routes": [{
            "name": "e2e", "model": "*",
            "backend": {"model": "openai/smollm2", "api_key": "none", "timeout": 600},
            "exact": False, "semantic": {"enabled": False},  # every turn must reach a replica
            "replicas": reps,
            "routing": routing,
        }],
    }




def _stats(urls: list[str]) -> list[dict[str, Any]]:
    return [httpx.get(f"{u}/stats", timeout=30).json() for u in urls]


def run_policy(policy: str, args: argparse.Namespace, firsts: list[list[dict[str, str]]], work: Path,
               threads: int, log: Any) -> tuple[dict[str, Any], list[Turn]]:
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
            argv = kvgate_argv("replica", "--port", str(port), "--name", f"r{i}", "--kv-dir", str(pdir / f"kv-r{i}"),
                               "--kv-ram-mb", str(args.kv_ram_mb), "--kv-disk-mb", str(args.kv_disk_mb),
                               "--kv-tail-mb", str(args.kv_tail_mb),
                               "--chunk-tokens", str(args.chunk_tokens), "--events-endpoint", events[-1],
                               "--threads", str(threads), "--log-level", "warning",
                               *(["--exact-prefill"] if args.exact_prefill else []))
            procs.append(Proc(f"{policy}-replica-r{i}", argv, pdir, env={"TOKENIZERS_PARALLELISM": "false"}))
            urls.append(f"http://127.0.0.1:{port}")
        cfg = pdir / "kvgate.yaml"
        cfg.write_text(yaml.safe_dump(proxy_config(policy, urls, events, args.chunk_tokens, pdir / "cache")))
        port = free_port()
        proxy = Proc(f"{policy}-proxy", kvgate_argv("serve", "--config", str(cfg), "--port", str(port),
                                                    "--log-level", "warning"), pdir, env={"TOKENIZERS_PARALLELISM": "false"})
        procs.append(proxy)
        for proc, url in zip(procs, [*urls, f"http://127.0.0.1:{port}"]):
            proc.wait_http(f"{url}/health", timeout=300)
        startup = time.perf_counter() - t0
        log(f"{policy}: {args.replicas} replicas + proxy up in {startup:.1f}s; {args.conversations} conversations × "
            f"{args.turns} turns")
        before = _stats(urls)
        records: list[Turn] = []
        barrier = threading.Barrier(args.conversations)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        starts = arrivals(args.conversations, args.arrival_s, args.seed)
        workers = [threading.Thread(target=converse, args=(url, i, firsts[i], args.turns, args.max_tokens,
                                                           args.think_s, args.seed, barrier, records, starts[i]),
                                    daemon=True)
                   for i in range(args.conversations)]
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

    def delta(key: str) -> list[float]:
        return [a[key] - b[key] for a, b in zip(after, before)]

    prompt, cached = sum(delta("prompt_tokens")), sum(delta("cached_tokens"))
    ok = [r for r in records if r.error is None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    by_turn = [[r.ttft_s for r in ok if r.turn == t and r.ttft_s is not None] for t in range(args.turns)]
    summary = {
        "router": f"kvgate {policy.removesuffix('_approximate')} "
                  f"({'precise: KV events' if policy == 'cache_aware' else 'approximate'})",
        "requests": len(records), "completed": len(ok), "errors": len(records) - len(ok),
        "not_sent": args.conversations * args.turns - len(records),
        "error_samples": [r.error for r in records if r.error][:3],
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else float("nan"),
        "ttft_p50_s": pct(ttfts, 0.5), "ttft_p99_s": pct(ttfts, 0.99),
        "ttft_by_turn_mean_s": [statistics.fmean(x) if x else None for x in by_turn],
        "ttft_mean_follow_ups_s": statistics.fmean(later) if (later := [x for ts in by_turn[1:] for x in ts]) else None,
        "prompt_tokens": int(prompt), "cached_tokens": int(cached), "prefill_tokens_computed": int(prompt - cached),
        "hit_rate": cached / prompt if prompt else 0.0,
        "requests_per_replica": [int(x) for x in delta("requests")],
        "replica_prefill_s": [round(x, 3) for x in delta("prefill_s")],
        "replica_load_s": [round(x, 3) for x in delta("load_s")],
        "empty_answers": sum(1 for r in ok if not r.answer),
        "startup_s": startup, "wall_s": wall,
    }
    served = {(r.conversation, r.turn): r.replica for r in ok}
    follow = [served[(c, t)] == served[(c, t - 1)] for (c, t) in served if t and (c, t - 1) in served]
    summary["follow_ups_on_previous_replica"] = sum(follow) / len(follow) if follow else None
    relayed = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    summary["usage_relayed"] = f"{len(relayed)}/{len(ok)}"  # whether the proxy passed cached_tokens through
    return summary, sorted(records, key=lambda r: (r.conversation, r.turn))


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int = 4) -> int:
    """Bytes of K and V one token occupies across all layers (HF config.json fields)."""
    from types import SimpleNamespace

    from engines.replica.model import kv_geometry

    layers, kv_heads, head_dim = kv_geometry(SimpleNamespace(**config))
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_working_set(records: list[dict[str, Any]], max_tokens: int, chunk_tokens: int, per_token: int) -> int:
    """Bytes of full chunks all conversations hold at their end: per conversation, its last
    prompt plus one answer, rounded down to whole chunks (what a chunk store keeps)."""
    final: dict[int, int] = {}
    for r in records:
        if r.get("prompt_tokens"):
            final[r["conversation"]] = max(final.get(r["conversation"], 0), r["prompt_tokens"] + max_tokens)
    return sum(n // chunk_tokens * chunk_tokens for n in final.values()) * per_token


def store_capacity_mb(ram_mb: int, disk_mb: int) -> int:
    """What one replica's chunk store can hold: the tiers are write-through (a chunk is written to
    every tier), so the largest tier bounds it, not their sum."""
    return max(ram_mb, disk_mb)


def run(args: argparse.Namespace) -> dict[str, Any]:
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    threads = args.replica_threads or max(1, (os.cpu_count() or 2) // args.replicas)
    log = lambda msg: print(f"[e2e] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    t_start = time.perf_counter()
    first = openings(args.conversations, args.opening_min_tokens, args.opening_max_tokens)
    log(f"openings: {[n for _, n in first]} prompt tokens")
    work = Path(tempfile.mkdtemp(prefix="kvgate-e2e-", dir=args.dir))
    result: dict[str, Any] = {
        "replicas": args.replicas, "conversations": args.conversations, "turns": args.turns,
        "max_tokens": args.max_tokens, "opening_tokens": [n for _, n in first], "chunk_tokens": args.chunk_tokens,
        "kv_ram_mb": args.kv_ram_mb, "kv_disk_mb": args.kv_disk_mb, "kv_tail_mb": args.kv_tail_mb,
        "replica_threads": threads,
        "exact_prefill": args.exact_prefill, "think_s": args.think_s, "arrival_s": args.arrival_s, "seed": args.seed,
        "machine": machine_info(work), "policies": {}, "requests_detail": {},
    }
    answers: dict[str, dict[tuple[int, int], str]] = {}
    for policy in policies:
        summary, records = run_policy(policy, args, [m for m, _ in first], work, threads, log)
        result["policies"][policy] = summary
        result["requests_detail"][policy] = [{k: v for k, v in asdict(r).items() if k != "answer"} for r in records]
        answers[policy] = {(r.conversation, r.turn): r.answer for r in records if r.error is None}
        log(f"{policy}: ttft mean {summary['ttft_mean_s'] * 1000:.0f} ms p50 {summary['ttft_p50_s'] * 1000:.0f} ms "
            f"p99 {summary['ttft_p99_s'] * 1000:.0f} ms, prefilled {summary['prefill_tokens_computed']} of "
            f"{summary['prompt_tokens']} prompt tokens, errors {summary['errors']}")
    ca, rr = result["policies"].get("cache_aware"), result["policies"].get("round_robin")
    if ca and rr and rr["ttft_mean_s"] > 0:
        result["ttft_mean_ratio_cache_aware_over_round_robin"] = ca["ttft_mean_s"] / rr["ttft_mean_s"]
        if ca["ttft_mean_follow_ups_s"] is not None and rr["ttft_mean_follow_ups_s"]:
            result["ttft_mean_follow_ups_ratio_cache_aware_over_round_robin"] = (
                ca["ttft_mean_follow_ups_s"] / rr["ttft_mean_follow_ups_s"])
        result["prefill_tokens_ratio_cache_aware_over_round_robin"] = (
            ca["prefill_tokens_computed"] / rr["prefill_tokens_computed"] if rr["prefill_tokens_computed"] else None)
    detail = next(iter(result["requests_detail"].values()), [])
    if detail:  # which regime this run was in: can each replica hold every conversation?
        from engines.replica.model import resolve_model_dir

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
    print(f"{args.conversations} conversations × {args.turns} turns over {args.replicas} replicas "
          f"(openings {min(result['opening_tokens'])}-{max(result['opening_tokens'])} tokens, {args.max_tokens} tokens per answer)")
    print(f"{'policy':24s} {'ttft mean':>10s} {'p50':>8s} {'p99':>8s} {'prefilled':>10s} {'cached':>8s} {'prompt':>8s} {'errors':>6s}")
    for name, s in result["policies"].items():
        print(f"{name:24s} {s['ttft_mean_s'] * 1000:8.0f}ms {s['ttft_p50_s'] * 1000:6.0f}ms {s['ttft_p99_s'] * 1000:6.0f}ms "
              f"{s['prefill_tokens_computed']:10d} {s['cached_tokens']:8d} {s['prompt_tokens']:8d} {s['errors']:6d}")
    if "kv_working_set_mb" in result:
        print(f"KV of all conversations at their end: {result['kv_working_set_mb']:.0f} MB; each replica's store "
              f"holds {result['kv_store_mb_per_replica']} MB (tiers are write-through: the largest tier bounds it)")
    if "ttft_mean_ratio_cache_aware_over_round_robin" in result:
        print(f"ttft mean cache_aware / round_robin: {result['ttft_mean_ratio_cache_aware_over_round_robin']:.2f}")
    if "ttft_mean_follow_ups_ratio_cache_aware_over_round_robin" in result:
        print(f"ttft mean of follow-up turns (2..T) cache_aware / round_robin: "
              f"{result['ttft_mean_follow_ups_ratio_cache_aware_over_round_robin']:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if any(s["errors"] or s["not_sent"] for s in result["policies"].values()) else 0
