"""`kvgate bench vllm`: routers compared in front of two real vLLM servers (the CPU build, SmolLM2-135M).

Two `vllm.entrypoints.openai.api_server` processes on loopback, one core each
(engines/vllm/launch.py: prefix caching, KV events, cached-token details; here also
VLLM_SERVER_DEV_MODE=1 for `POST /reset_prefix_cache`), and in front of them, one at a time, the arms:
`kvgate_precise` (kvgate serve, cache_aware, precise mode on the servers' KV events: no block_size
nor tokenizer given, the router finds them from the engine), `kvgate_approximate` (cache_aware,
approximate, tokenizer = the model dir), `round_robin` (kvgate serve), `sglang` (sglang-router
cache_aware) and `vllm_router` (vllm-router cache_aware); on request (--arms) the two kvgate arms with
policy prefill_time instead (`kvgate_precise_prefill_time`, `kvgate_approximate_prefill_time`),
`kvgate_precise_resident` (cache_aware with `new_sessions: resident`), `kvgate_precise_unpolled`
(kvgate precise whose proxy reads no replica's /metrics: `stats.scrape_replicas: never`),
`kvgate_precise_polled` (reads them every `engine_poll_s` whether anyone looks or not:
`stats.scrape_replicas: always`, the default before `watched`), and the
ablation `replay_precise`: no router at all, each turn sent straight to the engine kvgate precise
chose for it in the same run (listed after kvgate_precise), which separates where kvgate places
requests from what its proxy costs them. kvgate arms run with both response-cache
tiers off (every turn is routed) and a fresh cache_dir; every router is a fresh process per run.

Workload (tools/bench/vllm_arena_workload.py): conversations grouped from a Mooncake-format trace,
each trace block of 512 tokens scaled to `--block-tokens` real tokens (default 64, ×1/8), sent as
chat turns, `--concurrency` conversations at once (tools/bench/vllm_arena_client.py);
`--endpoint completions` sends the same turns as growing plain-text prompts to `/v1/completions`
through every arm (kvgate hashes them with the engine's tokenizer and no chat template; sglang-router
keys its tree on the prompt text; vllm-router asks a worker for `/v1/completions/render`). Reported
conversations are the first `--conversations` that fit; the anchors' thresholds (arena_routers'
ANCHOR_GRID) are tuned on the next `--tune-conversations`, disjoint from them, with the routing
arena's rule (kvgate.tools.bench.arena.choose: cached fraction within 0.01 of the best, then lowest TTFT
p99); `--tune-conversations 0` runs them at ANCHOR_DEFAULTS instead.

Every run (tools/bench/vllm_arena_bench.py) starts with both engines' prefix caches emptied (after
the router's warm-up requests) and reads vLLM's own counters before and after it
(tools/bench/vllm_arena_stats.py): cached_fraction = Δ prompt_tokens_cached / Δ prompt_tokens, both
servers together. Runs interleave the arms (run 1 of every arm, then run 2, ...), so slow drift on
the machine hits all, and each run rotates the arms' order by one place (`run_order`; each run's
record says its `position`), so no arm always goes first or last.

JSON (`--json`): `endpoint` (chat or completions); `routers.<arm>`: ttft_mean_s (mean over runs of each run's mean TTFT),
ttft_mean_ci_s (its 95% normal half-width, arena_table.mean_interval; null with one run),
ttft_p50_s / ttft_p90_s (every TTFT pooled), cached_fraction (all runs' tokens), errors, requests,
runs (each run: its position in the run's order, its TTFTs, engine counters, requests per server, computed_tokens_per_server
(the prompt tokens each engine prefilled: where the router put the work, for every arm), render_requests: the engines'
`.../render` calls, vllm-router's tokenization; its oracle; router_cpu_s, router_cpu_ms_per_request,
engines_cpu_s and client_cpu_s: CPU seconds over its measured requests, tools/bench/vllm_arena_cpu.py;
request_records: one small dict per request, with per_replica where a kvgate router named the replica
(through kvgate also each turn's Server-Timing steps, proxy_ms, and its head's wait, head_s);
with --wire every routed run adds wire_requests, wire_pre_mean_ms / wire_pre_p50_ms (a request's last
byte into the router to the router's first byte to an engine) and wire_post_mean_ms / wire_post_p50_ms
(the engine's first content event to the router's), read off a loopback capture (tools/bench/wire_hops.py),
and the arm their means over its runs;
a kvgate arm's runs add router_loop_lag, its event loop's lateness over the run (vllm_arena_stats.loop_lag),
and the arm its proxy_steps_ms, those steps over its runs by first and later turns;
the replay arm's runs add unplaced_turns, the turns the replayed run did not place);
the arm's router_cpu_s / engines_cpu_s / client_cpu_s are means over its runs, engine_ttft_mean_s
vLLM's own mean TTFT and added_ttft_ms the client's beyond it (vllm_arena_stats.added_ttft_ms),
inter_token_mean_s the mean gap between a stream's events after its first token (vllm_arena_client.inter_token_s,
per run and over the runs); top level:
paired (each kvgate arm's mean TTFT against each anchor's, run by run) and paired_engine_ttft (the
same of vLLM's own TTFT: the placement's part), router_nice (the routers' nice value), oracle_cached_fraction (all runs pooled), kv_cache_tokens and block_size (vLLM's
cache_config_info), machine (with the other vLLM servers found running), command, scaling, tuning.
A default run (16 conversations × 4 turns, 5 arms × 3 runs, tuning on 8) takes about 30 minutes
on 2 cores with nothing else running: ~65 s per cache-aware run, ~125 s per round_robin run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from kvgate.engines.vllm.launch import ROOT
from kvgate.middleware.progress import say
from kvgate.tools.bench.arena import choose
from kvgate.tools.bench.arena_routers import ANCHOR_DEFAULTS, ANCHOR_GRID, parse_grid
from kvgate.tools.bench.machine import hardware_info, machine_info
from kvgate.tools.bench.sliced import refused as slice_refused
from kvgate.tools.bench.stats import pct, write_json
from kvgate.tools.bench.vllm_arena_bench import Bench
from kvgate.tools.bench.vllm_arena_client import ENDPOINTS
from kvgate.tools.bench.vllm_arena_cpu import arm_cpu, proxy_steps
from kvgate.tools.bench.vllm_arena_setup import (
    ANCHOR_OF,
    REPLAY_ARM,
    REPLAYED,
    other_vllm_servers,
    placements,
    preflight,
)
from kvgate.tools.bench.vllm_arena_stats import paired_ratios, print_table, router_summary
from kvgate.tools.bench.vllm_arena_workload import scaling, usable, user_texts
from kvgate.tools.bench.wire_capture import unavailable as wire_unavailable

DEFAULT_ARMS = ("kvgate_precise", "kvgate_approximate", "round_robin", "sglang", "vllm_router")
ARMS = (
    *DEFAULT_ARMS,
    "kvgate_precise_prefill_time",
    "kvgate_approximate_prefill_time",
    "kvgate_precise_resident",
    "kvgate_precise_unpolled",
    "kvgate_precise_polled",
    "kvgate_precise_w2",
    "kvgate_precise_decode",
    "kvgate_precise_stall",
    "kvgate_approximate_stall",
    REPLAY_ARM,
)
DEFAULT_TRACE = ROOT.parent / "shared" / "data" / "mooncake_conversation_trace.jsonl"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", type=Path, required=True, help="where the result goes (also printed as a table)")
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Mooncake-format JSONL trace")
    p.add_argument("--runs", type=int, default=3, help="runs per arm (cold engine caches each)")
    p.add_argument("--conversations", type=int, default=16, help="reported conversations")
    p.add_argument("--turns", type=int, default=4, help="turns sent per conversation (of conversations with >= 4)")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS), help=f"comma list of {','.join(ARMS)}")
    p.add_argument("--concurrency", type=int, default=4, help="conversations in flight at once")
    p.add_argument("--max-tokens", type=int, default=16, help="answer length per turn (temperature 0)")
    p.add_argument("--block-tokens", type=int, default=64, help="real tokens per 512-token trace block")
    p.add_argument("--max-prompt-tokens", type=int, default=3500, help="skip conversations whose last turn is longer")
    p.add_argument(
        "--tune-conversations",
        type=int,
        default=8,
        help="conversations (after the reported ones) the anchors are tuned on; 0: ANCHOR_DEFAULTS",
    )
    p.add_argument("--anchor-grid", default=ANCHOR_GRID, metavar="CT/ABS/REL,...", help="anchor threshold candidates")
    p.add_argument(
        "--kv-cache-gib",
        type=int,
        default=1,
        help="each vLLM server's KV cache in GiB (VLLM_CPU_KVCACHE_SPACE: an integer)",
    )
    p.add_argument(
        "--endpoint",
        choices=tuple(ENDPOINTS),
        default="chat",
        help="chat: /v1/chat/completions turns; completions: the same turns as one growing text prompt "
        '("User: ...\\nAssistant: ...\\n", no chat template) to /v1/completions',
    )
    p.add_argument("--dir", type=Path, default=None, help="where the work directory (logs, configs) goes")
    p.add_argument(
        "--router-nice",
        type=int,
        default=0,
        help="every router process (kvgate and the anchors alike) runs at this nice value; negative puts it "
        "ahead of the engines for a core, as a router on CPUs of its own would be (needs root)",
    )
    p.add_argument(
        "--router-slice-us",
        type=int,
        default=0,
        help="every router process (kvgate and the anchors alike) runs with this custom CPU slice in µs "
        "(Linux 6.12+; 100-100000): it gets a core sooner after waking, at the same share. 0: the kernel's default",
    )
    p.add_argument(
        "--idle-s",
        type=float,
        default=5.0,
        help="seconds of each run's router CPU read before the run, with nothing sent (0: none): the "
        "JSON then splits the router's CPU into what it spends idle and per request beyond that",
    )
    p.add_argument(
        "--wire",
        action="store_true",
        help="capture each routed run's loopback packets (tcpdump, root) and report where each request's time "
        "goes on the wire: before the router's request reaches an engine, and the first token's relay "
        "(tools/bench/wire_hops.py)",
    )
    p.add_argument(
        "--kv-connector",
        action="store_true",
        help="every engine loads kvgate's KV connector over one shared disk directory (emptied with the "
        "prefix caches before each run); external_fraction = tokens it loaded / prompt tokens",
    )


def validate(args: argparse.Namespace) -> list[str]:
    bad = [
        f"--{n.replace('_', '-')} must be >= 1"
        for n in ("runs", "conversations", "turns", "concurrency", "max_tokens", "block_tokens")
        if getattr(args, n) < 1
    ]
    if args.concurrency < 2:
        bad.append("--concurrency must be >= 2 (at least two conversations in flight)")
    if args.tune_conversations < 0:
        bad.append("--tune-conversations must be >= 0")
    if not -20 <= args.router_nice <= 19:
        bad.append("--router-nice must be between -20 and 19")
    elif args.router_nice < 0 and os.geteuid() != 0:
        bad.append("--router-nice below 0 needs root (raising a process's priority is privileged)")
    if args.router_slice_us:
        refused = slice_refused(args.router_slice_us)
        if refused:
            bad.append(f"--router-slice-us {args.router_slice_us}: {refused}")
    arms = parse_arms(args.arms)
    unknown = [a for a in arms if a not in ARMS]
    if not arms or unknown or len(set(arms)) != len(arms):
        bad.append(f"--arms: {unknown or 'empty or repeated'}; choose from {','.join(ARMS)}")
    elif REPLAY_ARM in arms and (REPLAYED not in arms or arms.index(REPLAYED) > arms.index(REPLAY_ARM)):
        bad.append(f"--arms: {REPLAY_ARM} replays {REPLAYED}'s placements of the same run: list {REPLAYED} before it")
    if args.wire and (why := wire_unavailable()):
        bad.append(f"--wire: {why}")
    try:
        parse_grid(args.anchor_grid)
    except ValueError as exc:
        bad.append(f"--anchor-grid: {exc}")
    return bad


def parse_arms(text: str) -> list[str]:
    return [a.strip() for a in text.split(",") if a.strip()]


def run_order(arms: Sequence[str], run: int) -> list[str]:
    """The arms in the order run `run` (0-based) sends them: rotated by one place per run, so
    each arm goes first, second, ... equally often over a multiple of len(arms) runs, and what a
    position costs (an engine still settling, a neighbour's load growing through a run) falls on
    every arm alike. The replay arm stays after the arm it replays (pure)."""
    rotating = [a for a in arms if a != REPLAY_ARM]
    k = run % len(rotating) if rotating else 0
    order = rotating[k:] + rotating[:k]
    return order + [REPLAY_ARM] if REPLAY_ARM in arms else order


def tune(bench: Bench, arms: Sequence[str], texts: list[list[str]], block_size: int) -> dict[str, Any]:
    """Every ANCHOR_GRID candidate of every anchor arm on the tuning conversations; the pick."""
    out: dict[str, Any] = {"candidates": {}, "chosen": {}}
    for arm in (a for a in arms if a in ANCHOR_OF):
        cands = []
        for i, params in enumerate(parse_grid(bench.args.anchor_grid)):
            s = bench.run(arm, params, texts, f"tuning {i + 1}", block_size)
            p99 = pct(s["ttfts_s"], 0.99) if s["ttfts_s"] else float("inf")
            bench.log(
                f"tuning {arm} {params}: cached {s['cached_fraction']}, ttft mean {s['ttft_mean_s']}, p99 {p99}, errors {s['errors']}"
            )
            cands.append(
                {
                    "params": params,
                    "summary": {
                        "hit_rate": s["cached_fraction"] or 0.0,
                        "ttft_p99_s": p99,
                        "ttft_mean_s": s["ttft_mean_s"],
                        "errors": s["errors"],
                    },
                }
            )
        out["candidates"][arm] = cands
        out["chosen"][arm] = choose(cands)["params"]
    return out


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    arms = parse_arms(args.arms)
    log = say("vllm-arena")
    convs, counts = usable(args)
    tuning_on = args.tune_conversations > 0 and any(a in ANCHOR_OF for a in arms)
    need = args.conversations + (args.tune_conversations if tuning_on else 0)
    if len(convs) < need:
        raise SystemExit(
            f"kvgate bench vllm: {args.trace} has {len(convs)} usable conversations, need {need} ({counts})"
        )
    reported, tuning_set = convs[: args.conversations], convs[args.conversations : need]
    texts = [user_texts(c, args.block_tokens) for c in reported]
    log(
        f"{len(reported)} conversations × {args.turns} turns ({sum(len(t) for t in texts)} requests per run), "
        f"arms {arms}, {args.runs} runs each"
    )
    others = other_vllm_servers()
    if others:
        log(
            f"warning: {others} other vLLM server(s) already run on this machine: the timings share its cores with them"
        )
    work = Path(tempfile.mkdtemp(prefix="kvgate-vllm-arena-", dir=args.dir))
    bench = Bench(args, work)
    result: dict[str, Any] = {
        "endpoint": args.endpoint,
        "routers": {},
        "oracle_cached_fraction": None,
        "kv_cache_tokens": None,
        "machine": {
            **hardware_info(work),
            "load_average_1_5_15m": machine_info()["load_average_1_5_15m"],
            "other_vllm_servers_at_start": others,
        },
        "command": "kvgate " + shlex.join(sys.argv[1:]),
        "router_nice": args.router_nice,
        "router_slice_us": args.router_slice_us,
        "scaling": {
            **scaling(args.block_tokens, args.max_prompt_tokens, args.max_tokens, counts),
            "trace": str(args.trace),
            "turns": args.turns,
            "concurrency": args.concurrency,
            "reported_conversations": [c.requests[0] for c in reported],
        },
    }
    if args.endpoint == "completions":  # the chat template `how` names is not sent
        result["scaling"]["prompt_format"] = (
            "completions: 'User: <text>\\nAssistant:'; turn k = turn k-1's prompt + "
            "its answer + '\\nUser: <text>\\nAssistant:', no chat template"
        )
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    t_start = time.perf_counter()
    try:
        bench.start()
        info = bench.engine_info()
        result.update(
            kv_cache_tokens=info["kv_cache_tokens"], block_size=info["block_size"], vllm_version=info["vllm_version"]
        )
        block = info["block_size"] or 16
        if tuning_on:
            tuned = tune(bench, arms, [user_texts(c, args.block_tokens) for c in tuning_set], block)
            result["tuning"] = {
                "tuned": True,
                "grid": args.anchor_grid,
                "rule": "arena's choose(): cached fraction within 0.01 of the best error-free candidate, then lowest TTFT p99",
                "conversations": [c.requests[0] for c in tuning_set],
                **tuned,
            }
        else:
            result["tuning"] = {"tuned": False, "note": f"anchors at the arena's defaults {ANCHOR_DEFAULTS}, no tuning"}
        chosen = result["tuning"].get("chosen", {})
        for r in range(args.runs):
            order = run_order(arms, r)
            for position, arm in enumerate(order):
                params = chosen.get(arm, dict(ANCHOR_DEFAULTS)) if arm in ANCHOR_OF else {}
                placed = placements(runs[REPLAYED][-1]["request_records"]) if arm == REPLAY_ARM else None
                s = bench.run(arm, params, texts, f"run {r + 1}/{args.runs}", block, placed)
                runs[arm].append({"run": r + 1, "position": position, **s})
                log(
                    f"{arm} run {r + 1}: ttft mean {s['ttft_mean_s']}, cached {s['cached_fraction']}, "
                    f"oracle {s['oracle_cached_fraction']}, errors {s['errors']}"
                )
    finally:
        bench.stop()
    for arm in arms:
        if runs[arm]:
            result["routers"][arm] = router_summary(
                runs[arm],
                router=runs[arm][0]["router"],
                params=runs[arm][0]["params"],
                **arm_cpu(runs[arm]),
                **proxy_steps(runs[arm]),
            )
    kvgate_arms = [a for a in arms if a.startswith("kvgate")]
    anchors = [a for a in arms if a in ANCHOR_OF]
    result["paired"] = paired_ratios(runs, kvgate_arms, anchors)
    result["paired_engine_ttft"] = paired_ratios(runs, kvgate_arms, anchors, key="engine_ttft_mean_s")
    done = [r for rs in runs.values() for r in rs]
    oracle_prompt = sum(r["oracle_prompt_tokens"] for r in done)
    result["oracle_cached_fraction"] = (
        sum(r["oracle_cached_tokens"] for r in done) / oracle_prompt if oracle_prompt else None
    )
    result["machine"]["other_vllm_servers_at_end"] = other_vllm_servers()
    result.update(wall_s=round(time.perf_counter() - t_start, 1), logs=str(work))
    return result


def main(args: argparse.Namespace) -> int:
    problems = validate(args) or preflight(parse_arms(args.arms), args.trace)
    if problems:
        for msg in problems:
            print(f"kvgate bench vllm: error: {msg}", file=sys.stderr)
        return 2

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # unwinds through run_bench's finally: servers and router stopped

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        result = run_bench(args)
    finally:
        signal.signal(signal.SIGTERM, previous)
    write_json(args.json, result)
    print_table(result)
    return 1 if any(s["errors"] for s in result["routers"].values()) else 0
