"""`kvgate bench routing`: the routing arena.

Replays a Mooncake-format trace at its timestamps (÷ speed) against N simulated replicas
(`kvgate sim-replica`, text tokenizer: one token per character; `--sim-model fifo` = LRU prefix
cache + serial FIFO prefill, `batched` = continuous batching with chunked prefill and a
leaf-first block cache), once per router, resetting the replicas' caches between runs: kvgate's
policies through `kvgate serve`, and the anchors sglang-router and vllm-router (policy names
`sglang`, `vllm_router`), all on the same replicas with the same requests.

Fair play (tools/bench/arena_routers.py): kvgate runs approximate mode with no knowledge the
anchors lack (`--capacity-hint none`: capacity_blocks unset; `reported`: the size the replicas
report, given to the anchors as `--max-tree-size` too), record_answers at its default.
Tuning and reporting use disjoint slices of the trace: `--tune-slice A:B` is where the anchors'
thresholds (`--anchor-grid`) and any `--kvgate-grid` candidates are compared; `--report-slice C:D`
is where every router is then measured once. The tuning pick: among candidates with no errors
and a hit rate within 0.01 of the best candidate's, the lowest TTFT p99. The JSON records both
slices, every candidate and the pick. `--table FILE...` prints the JSON results as markdown;
when some scenario (trace, sim model, speed) was run more than once, a pooled table first.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
from pathlib import Path
from typing import Any, Callable

import httpx
import yaml

from kvgate.middleware.progress import say
from kvgate.tools.bench.arena_replay import BLOCK_SIZE, ceilings, replay_sampled, replica_stats, summarise
from kvgate.tools.bench.arena_routers import (
    ANCHOR_DEFAULTS,
    ANCHOR_GRID,
    ANCHORS,
    KVGATE_POLICIES,
    anchor_launch,
    kvgate_config,
    parse_grid,
)
from kvgate.tools.bench.arena_table import print_tables
from kvgate.tools.bench.plot import add_plot_option, write_plot
from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv
from kvgate.tools.bench.stats import write_json
from kvgate.tools.bench.trace import TraceRequest, load_trace, prompt_text

TUNE_HIT_TOLERANCE = 0.01


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", type=Path, help="Mooncake-format JSONL trace (see also `kvgate bench gen-trace`)")
    p.add_argument("--scenario", default=None, help="label for the result (default: trace name ×speed, sim model)")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument(
        "--capacity-tokens", type=int, default=1_500_000, help="prefix cache per replica (tokens = characters)"
    )
    p.add_argument("--sim-model", choices=["fifo", "batched"], default="fifo", help="the replicas' timing model")
    p.add_argument("--step-tokens", type=int, default=2048, help="batched: token budget per engine step")
    p.add_argument("--speed", type=float, default=5.0, help="replay speed-up over the trace's timestamps")
    p.add_argument("--limit", type=int, default=2000, help="without --report-slice: report on the first N requests")
    p.add_argument("--tune-slice", default=None, metavar="A:B", help="requests [A, B) for tuning (default: no tuning)")
    p.add_argument("--report-slice", default=None, metavar="C:D", help="requests [C, D) reported (default 0:limit)")
    p.add_argument(
        "--policies",
        default="round_robin,least_loaded,cache_aware,sglang,vllm_router",
        help=f"comma list of {','.join(KVGATE_POLICIES)},{','.join(ANCHORS)}",
    )
    p.add_argument(
        "--anchor-grid",
        default=ANCHOR_GRID,
        metavar="CT/ABS/REL,...",
        help="anchors' cache_threshold/balance_abs_threshold/balance_rel_threshold candidates (with --tune-slice)",
    )
    p.add_argument(
        "--kvgate-grid",
        default="",
        metavar="K=V[;K=V...]",
        help="cache_aware routing option candidates tried on the tuning slice, e.g. 'miss_weight=4;miss_weight=8'",
    )
    p.add_argument(
        "--capacity-hint",
        choices=["none", "reported"],
        default="none",
        help="what every router is told of the replicas' cache size (see tools/bench/arena_routers.py)",
    )
    p.add_argument("--prefill-tps", type=float, default=None, help="per replica; default 12k × speed")
    p.add_argument("--decode-tps", type=float, default=None, help="per request; default 60 × speed")
    p.add_argument("--max-output-tokens", type=int, default=256, help="cap on a request's output_length")
    p.add_argument(
        "--clients",
        type=int,
        default=1,
        metavar="N",
        help="load-generator processes (request i from process i mod N); >1 keeps one Python loop "
        "reading every stream from delaying the TTFT it measures",
    )
    p.add_argument("--block-tokens", type=int, default=512, help="tokens per trace hash id")
    p.add_argument(
        "--routing",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra kvgate routing option for every kvgate policy (repeatable), e.g. miss_weight=1.5",
    )
    p.add_argument(
        "--per-request",
        action="store_true",
        help="also keep each request's replica, cached tokens and TTFT under policies.<name>.per_request",
    )
    p.add_argument("--json", type=Path, default=None)
    add_plot_option(p)
    p.add_argument(
        "--table",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSON",
        help="print markdown tables of earlier results and exit (runs of one scenario pooled: goal count, mean and smallest margin)",
    )


def parse_slice(text: str) -> tuple[int, int]:
    a, _, b = text.partition(":")
    lo, hi = int(a or 0), int(b)
    if not 0 <= lo < hi:
        raise SystemExit(f"kvgate bench routing: bad slice {text!r} (want A:B with 0 <= A < B)")
    return lo, hi


def choose(candidates: list[dict[str, Any]]) -> dict[str, Any]:
    """The tuning pick (pure): among error-free candidates within TUNE_HIT_TOLERANCE of the best
    hit rate, the lowest TTFT p99; with no error-free one, the fewest errors."""
    ok = [c for c in candidates if c["summary"]["errors"] == 0] or [
        min(candidates, key=lambda c: c["summary"]["errors"])
    ]
    best = max(c["summary"]["hit_rate"] for c in ok)
    near = [c for c in ok if c["summary"]["hit_rate"] >= best - TUNE_HIT_TOLERANCE]
    return min(near, key=lambda c: c["summary"]["ttft_p99_s"])


class Arena:
    """Replicas up, then one router at a time on a slice of the trace."""

    def __init__(self, args: argparse.Namespace, trace: list[TraceRequest], work: Path) -> None:
        self.args, self.trace, self.work = args, trace, work
        self.prompts = [prompt_text(r, args.block_tokens) for r in trace]
        self.prefill = args.prefill_tps or 12_000 * args.speed
        self.decode = args.decode_tps or 60 * args.speed
        self.replicas: list[Proc] = []
        self.urls: list[str] = []
        self.events: list[str] = []
        self.extra = {k.strip(): yaml.safe_load(v) for k, _, v in (item.partition("=") for item in args.routing)}
        self.capacity_blocks: int | None = None
        self.runs = 0

    def start(self) -> None:
        a = self.args
        for i in range(a.replicas):
            port = free_port()
            self.events.append(f"tcp://127.0.0.1:{free_port()}")
            argv = kvgate_argv(
                "sim-replica",
                "--port",
                str(port),
                "--name",
                f"r{i}",
                "--capacity-tokens",
                str(a.capacity_tokens),
                "--prefill-tps",
                str(self.prefill),
                "--decode-tps",
                str(self.decode),
                "--block-size",
                str(BLOCK_SIZE),
                "--events-endpoint",
                self.events[-1],
                "--sim-model",
                a.sim_model,
                "--step-tokens",
                str(a.step_tokens),
            )
            self.replicas.append(Proc(f"replica-r{i}", argv, self.work))
            self.urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(self.replicas, self.urls):
            proc.wait_http(f"{url}/health")
        if a.capacity_hint == "reported":
            self.capacity_blocks = min(s["capacity_blocks"] for s in replica_stats(self.urls))

    def stop(self) -> None:
        for proc in self.replicas:
            proc.stop()

    def run(self, policy: str, params: dict[str, Any], lo: int, hi: int) -> dict[str, Any] | None:
        """One router on requests [lo, hi) with fresh replica caches; None if it is not installed."""
        for u in self.urls:
            httpx.post(f"{u}/reset", timeout=10)
        port = free_port()
        self.runs += 1
        proxy_url = None
        if policy in ANCHORS:
            tree = None if self.capacity_blocks is None else self.capacity_blocks * BLOCK_SIZE
            launch = anchor_launch(policy, port, self.urls, {**ANCHOR_DEFAULTS, **params}, tree)
            if launch is None:
                return None
            router, label = Proc(f"router-{policy}-{self.runs}", launch.argv, self.work), launch.label
        else:
            cfg_path = self.work / f"kvgate-{policy}-{self.runs}.yaml"
            cfg = kvgate_config(
                policy,
                self.urls,
                str(self.work / f"cache-{self.runs}"),
                self.events,
                self.capacity_blocks,
                {**self.extra, **params},
            )
            cfg_path.write_text(yaml.safe_dump(cfg))
            router = Proc(
                f"router-{policy}-{self.runs}",
                kvgate_argv("serve", "--config", str(cfg_path), "--port", str(port), "--log-level", "warning"),
                self.work,
            )
            label, proxy_url = f"kvgate {policy}" + (f" {params}" if params else ""), f"http://127.0.0.1:{port}"
        try:
            router.wait_http(f"http://127.0.0.1:{port}/health")
            warm_up(f"http://127.0.0.1:{port}/v1/chat/completions", self.urls)
            run = asyncio.run(
                replay_sampled(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    self.trace[lo:hi],
                    self.prompts[lo:hi],
                    self.args.speed,
                    self.args.max_output_tokens,
                    self.urls,
                    proxy_url,
                    clients=self.args.clients,
                    per_request=self.args.per_request,
                )
            )
        finally:
            router.stop()
        summary = summarise(run, replica_stats(self.urls))
        summary.update(router=label, params=params)
        return summary


def warm_up(url: str, replica_urls: list[str], n: int = 4) -> None:
    """A few short requests through a fresh router (first-call costs: connections, lazy imports),
    then the replicas are reset so the measured run starts from empty caches and zero counters."""
    for i in range(n):
        body = {
            "model": "sim",
            "messages": [{"role": "user", "content": f"warm-up {i}"}],
            "max_tokens": 2,
            "stream": True,
        }
        with httpx.stream("POST", url, json=body, headers={"authorization": "Bearer arena"}, timeout=60) as resp:
            resp.read()
    for u in replica_urls:
        httpx.post(f"{u}/reset", timeout=10)


def tune(arena: Arena, policies: list[str], lo: int, hi: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Every candidate of every tunable router on [lo, hi); the pick per router (see `choose`)."""
    a = arena.args
    grids: dict[str, list[dict[str, Any]]] = {p: parse_grid(a.anchor_grid) for p in policies if p in ANCHORS}
    kv = [
        {k.strip(): yaml.safe_load(v) for k, _, v in (kv.partition("=") for kv in c.split(",") if kv)}
        for c in a.kvgate_grid.split(";")
        if c.strip()
    ]
    if kv and "cache_aware" in policies:
        grids["cache_aware"] = kv
    out: dict[str, Any] = {
        "slice": f"{lo}:{hi}",
        "objective": f"lowest TTFT p99 among error-free candidates with hit rate >= best - {TUNE_HIT_TOLERANCE}",
        "candidates": {},
        "chosen": {},
    }
    for policy, grid in grids.items():
        cands = []
        for params in grid:
            s = arena.run(policy, params, lo, hi)
            if s is None:
                break
            log(
                f"tune {policy} {params}: hit {s['hit_rate']:.3f} p99 {s['ttft_p99_s'] * 1000:.0f} ms errors {s['errors']}"
            )
            cands.append(
                {
                    "params": params,
                    "summary": {k: s[k] for k in ("hit_rate", "ttft_p50_s", "ttft_p99_s", "imbalance", "errors")},
                }
            )
        if cands:
            out["candidates"][policy] = cands
            out["chosen"][policy] = choose(cands)["params"]
    return out


def run_arena(args: argparse.Namespace) -> dict[str, Any]:
    report = parse_slice(args.report_slice) if args.report_slice else (0, args.limit)
    tune_slice = parse_slice(args.tune_slice) if args.tune_slice else None
    if tune_slice and not (tune_slice[1] <= report[0] or report[1] <= tune_slice[0]):
        raise SystemExit("kvgate bench routing: --tune-slice and --report-slice overlap")
    trace = load_trace(args.trace, max(report[1], tune_slice[1] if tune_slice else 0))
    report = (report[0], min(report[1], len(trace)))
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p not in (*KVGATE_POLICIES, *ANCHORS):
            raise SystemExit(f"kvgate bench routing: unknown policy {p!r}")
    log = say("arena")
    sl = trace[report[0] : report[1]]
    span = (sl[-1].timestamp_ms - sl[0].timestamp_ms) / 1000
    log(
        f"report slice {report[0]}:{report[1]}: {len(sl)} requests over {span:.0f}s of trace → {span / args.speed:.0f}s per router"
    )
    work = Path(tempfile.mkdtemp(prefix="kvgate-arena-"))
    arena = Arena(args, trace, work)
    prompts = arena.prompts[report[0] : report[1]]
    result: dict[str, Any] = {
        "scenario": args.scenario or f"{args.trace.stem} ×{args.speed:g}, {args.sim_model}",
        "trace": str(args.trace),
        "sim_model": args.sim_model,
        "speed": args.speed,
        "replicas": args.replicas,
        "clients": args.clients,
        "capacity_tokens": args.capacity_tokens,
        "capacity_hint": args.capacity_hint,
        "step_tokens": args.step_tokens if args.sim_model == "batched" else None,
        "prefill_tps": arena.prefill,
        "decode_tps": arena.decode,
        "block_size": BLOCK_SIZE,
        "max_output_tokens": args.max_output_tokens,
        "block_tokens": args.block_tokens,
        "report_slice": f"{report[0]}:{report[1]}",
        "tune_slice": f"{tune_slice[0]}:{tune_slice[1]}" if tune_slice else None,
        "requests": len(sl),
        "prompt_tokens_total": sum(len(p) for p in prompts),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "routing_options": arena.extra,
        "policies": {},
    }
    result.update(ceilings(prompts, args.replicas * args.capacity_tokens))
    log(f"ceilings: infinite {result['ceiling_infinite']:.3f}, lru {result['ceiling_lru']:.3f}")
    try:
        arena.start()
        result["capacity_blocks_hint"] = arena.capacity_blocks
        chosen: dict[str, Any] = {}
        if tune_slice:
            result["tuning"] = tune(arena, policies, *tune_slice, log)
            chosen = result["tuning"]["chosen"]
        for policy in policies:
            s = arena.run(policy, chosen.get(policy, {}), *report)
            if s is None:
                result["policies"][policy] = {"skipped": f"{policy} is not installed"}
                continue
            result["policies"][policy] = s
            log(
                f"{policy}: hit {s['hit_rate']:.3f} ttft p50 {s['ttft_p50_s'] * 1000:.0f} ms p99 {s['ttft_p99_s'] * 1000:.0f} ms "
                f"imbalance {s['imbalance']:.2f} errors {s['errors']}"
            )
    finally:
        arena.stop()
    ca = result["policies"].get("cache_aware", {})
    for anchor in ANCHORS:
        an = result["policies"].get(anchor, {})
        if "hit_rate" in ca and "hit_rate" in an:
            result[f"cache_aware_minus_{anchor}_hit_rate"] = ca["hit_rate"] - an["hit_rate"]
            result[f"cache_aware_p99_over_{anchor}_p99"] = ca["ttft_p99_s"] / an["ttft_p99_s"]
    if "hit_rate" in ca and result["ceiling_lru"]:
        result["cache_aware_vs_ceiling_lru"] = ca["hit_rate"] / result["ceiling_lru"]
    result["logs"] = str(work)
    return result


def main(args: argparse.Namespace) -> int:
    if args.table:
        print_tables(args.table)
        return 0
    if args.trace is None:
        raise SystemExit("kvgate bench routing: --trace is required (or --table JSON...)")
    if args.clients < 1:
        raise SystemExit(f"kvgate bench routing: --clients must be at least 1, got {args.clients}")
    result = run_arena(args)
    write_json(args.json, result)
    print_tables([result])
    return write_plot("routing", args.plot, result)
