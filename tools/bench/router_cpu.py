"""A router's CPU per request on `kvgate bench vllm`'s conversations, without vLLM.

    kvgate bench router-cpu [--rounds 3] [--conversations 32] [--arms kvgate_precise,sglang]
                            [--trees DIR,DIR] [--decode-tps 80] [--json FILE]

The same turns `kvgate bench vllm` sends (Mooncake conversations scaled to SmolLM2's tokens, the
engine's answers in the history, `--concurrency` conversations at a time, `--max-tokens` streamed
tokens each) go through each router in front of two `kvgate sim-replica` engines that stand in for
vLLM where a router can tell: SmolLM2's tokenizer and chat template, 128-token blocks, vLLM's KV
events over ZMQ (precise mode reads them), the answer streamed token by token at `--decode-tps`,
a prefix cache the size of the bench's vLLM servers. Their prefill is fast (`--prefill-tps`), so
a run takes seconds where the same turns take minutes on the CPU build of vLLM, and the router's
CPU is all that differs between arms.

Per arm and round: the router's process tree's CPU over the run (the scheduler's nanosecond
counts), its idle rate just before, CPU per request and busy CPU per request (less the idle rate
over the run's wall time), and each kvgate arm's ratio to sglang-router's busy CPU in the same
round. The engines are started afresh for every arm, so each router sees cold caches and the
same KV events. Arms run in turn within a round; rounds repeat.

`--trees`: kvgate source trees (each a directory holding `kvgate/`, e.g. a `git worktree` of
another commit) whose kvgate arms run alternately in every round, for an A/B of a change; the
engines and the client always run the installed code.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from kvgate.middleware.progress import say
from kvgate.tools.bench.arena_routers import anchor_launch, parse_grid
from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv
from kvgate.tools.bench.stats import write_json
from kvgate.tools.bench.vllm_arena_client import converse
from kvgate.tools.bench.vllm_arena_cpu import idle_cpu_ms_per_s, tree_on_cpu_s
from kvgate.tools.bench.vllm_arena_setup import KVGATE_ARMS, MODEL, kvgate_config, wait_workers, warm_up
from kvgate.tools.bench.vllm_arena_stats import paired_ratio
from kvgate.tools.bench.vllm_arena_workload import usable, user_texts

ANCHOR = "sglang"
BLOCK_SIZE = 128  # vLLM's block on its CPU build, what the bench's servers cache in
KV_CACHE_TOKENS = 23296  # the bench's vLLM servers' KV cache (a 0.6 GB cache of SmolLM2-135M)
IDLE_S = 3.0  # the idle window before each run


@dataclass(frozen=True)
class Engine:
    """A sim replica as kvgate_config reads a vLLM server: its API base and KV-event endpoint."""

    api_base: str
    events: str
    proc: Proc


def add_arguments(p: argparse.ArgumentParser) -> None:
    from kvgate.tools.bench.vllm_arena import DEFAULT_TRACE

    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Mooncake-format JSONL trace")
    p.add_argument("--rounds", type=int, default=3, help="rounds; each runs every arm once")
    p.add_argument("--conversations", type=int, default=32, help="conversations per run")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=4, help="conversations in flight at once")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens streamed per answer")
    p.add_argument("--block-tokens", type=int, default=64, help="real tokens per 512-token trace block")
    p.add_argument("--max-prompt-tokens", type=int, default=3500)
    p.add_argument("--arms", default="kvgate_precise,kvgate_approximate,sglang", help="kvgate_* arms and sglang")
    p.add_argument("--anchor", default="0.5/8/1.25", metavar="CT/ABS/REL", help="sglang-router's thresholds")
    p.add_argument("--decode-tps", type=float, default=80.0, help="the engines' tokens per second per answer")
    p.add_argument("--prefill-tps", type=float, default=200_000.0, help="the engines' prefill tokens per second")
    p.add_argument("--trees", default="", help="comma list of kvgate source trees for the kvgate arms (A/B)")
    p.add_argument("--json", type=Path, default=None)


def validate(args: argparse.Namespace) -> list[str]:
    bad = []
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a != ANCHOR and a not in KVGATE_ARMS]
    if unknown:
        bad.append(f"--arms: unknown {unknown} (kvgate arms: {', '.join(KVGATE_ARMS)}; anchor: {ANCHOR})")
    if not arms:
        bad.append("--arms: name at least one arm")
    for name in ("rounds", "conversations", "turns", "concurrency", "max_tokens"):
        if getattr(args, name) < 1:
            bad.append(f"--{name.replace('_', '-')} must be at least 1")
    if args.decode_tps <= 0 or args.prefill_tps <= 0:
        bad.append("--decode-tps and --prefill-tps must be positive")
    try:
        parse_grid(args.anchor)
    except ValueError as exc:
        bad.append(f"--anchor: {exc}")
    for tree in filter(None, (t.strip() for t in args.trees.split(","))):
        if not (Path(tree) / "kvgate").is_dir():
            bad.append(f"--trees: {tree} holds no kvgate/ directory")
    return bad


def start_engines(args: argparse.Namespace, tokenizer: str, work: Path) -> list[Engine]:
    engines = []
    try:
        for i in range(2):
            port, events = free_port(), f"tcp://127.0.0.1:{free_port()}"
            argv = kvgate_argv(
                "sim-replica",
                *("--port", str(port), "--model", MODEL, "--tokenizer", tokenizer),
                *("--block-size", str(BLOCK_SIZE), "--capacity-tokens", str(KV_CACHE_TOKENS)),
                *("--prefill-tps", str(args.prefill_tps), "--decode-tps", str(args.decode_tps)),
                *("--events-endpoint", events),
            )
            proc = Proc(f"engine-{i}", argv, work)
            engines.append(Engine(f"http://127.0.0.1:{port}/v1", events, proc))
        for engine in engines:
            engine.proc.wait_http(engine.api_base.removesuffix("/v1") + "/health")
    except BaseException:
        for engine in engines:
            engine.proc.stop()
        raise
    return engines


def sim_config(arm: str, engines: Sequence[Engine], work: Path, tokenizer: str) -> dict[str, Any]:
    """`kvgate bench vllm`'s config of a kvgate arm, told what a vLLM server would tell it and a
    sim replica does not: the tokenizer (vLLM's /v1/models names its model dir) and the block
    size (vLLM's cache_config_info)."""
    config = kvgate_config(arm, engines, work / f"cache-{arm}", tokenizer)
    for route in config["routes"]:
        route["routing"]["prefix"].update({"tokenizer": tokenizer, "block_size": BLOCK_SIZE})
    return config


def start_router(
    arm: str, tree: str, engines: Sequence[Engine], args: argparse.Namespace, work: Path
) -> tuple[Proc, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if arm == ANCHOR:
        (params,) = parse_grid(args.anchor)
        launch = anchor_launch(ANCHOR, port, [e.api_base.removesuffix("/v1") for e in engines], params, None)
        if launch is None or launch.argv is None:
            raise SystemExit("kvgate bench router-cpu: sglang-router is not installed (make install)")
        proc = Proc(f"router-{arm}", launch.argv, work)
        try:
            wait_workers(url + "/readiness", len(engines))
        except BaseException:
            proc.stop()
            raise
        return proc, url
    config = work / f"{arm}.yaml"
    config.write_text(yaml.safe_dump(sim_config(arm, engines, work, args.tokenizer)))
    argv = kvgate_argv("serve", "--config", str(config), "--port", str(port), "--log-level", "warning")
    proc = Proc(f"router-{arm}", argv, work, env={"PYTHONPATH": tree} if tree else None, cwd=work)
    try:
        proc.wait_http(url + "/health")
    except BaseException:
        proc.stop()
        raise
    return proc, url


def one_run(arm: str, tree: str, texts: list[list[str]], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Fresh engines, one router in front of them, the conversations through it: its CPU."""
    work.mkdir(parents=True)
    engines = start_engines(args, args.tokenizer, work)
    try:
        proc, url = start_router(arm, tree, engines, args, work)
        try:
            url += "/v1/chat/completions"
            asyncio.run(warm_up(url))
            pids = [proc.proc.pid]
            idle = idle_cpu_ms_per_s(pids, IDLE_S) or 0.0
            cpu0, t0 = tree_on_cpu_s(pids), time.perf_counter()
            turns = asyncio.run(
                converse(url, texts, model=MODEL, max_tokens=args.max_tokens, concurrency=args.concurrency)
            )
            cpu, wall = tree_on_cpu_s(pids) - cpu0, time.perf_counter() - t0
        finally:
            proc.stop()
    finally:
        for engine in engines:
            engine.proc.stop()
    n = len(turns)
    errors = sum(t.error is not None for t in turns)
    return {
        "arm": arm,
        "tree": tree or "installed",
        "requests": n,
        "errors": errors,
        "error_samples": sorted({str(t.error) for t in turns if t.error is not None})[:3],
        "wall_s": round(wall, 2),
        # the engines' own count: equal across arms, the routers placed alike and their CPU compares
        "cached_fraction": cached_fraction(turns),
        "cpu_ms_per_request": round(cpu * 1000 / n, 3) if n else None,
        "idle_cpu_ms_per_s": idle,
        "busy_cpu_ms_per_request": round((cpu * 1000 - idle * wall) / n, 3) if n else None,
    }


def cached_fraction(turns: Sequence[Any]) -> float | None:
    """The engines' cached prompt tokens over all prompt tokens of the turns that reported usage."""
    prompt = sum(t.prompt_tokens or 0 for t in turns if t.cached_tokens is not None)
    return round(sum(t.cached_tokens or 0 for t in turns) / prompt, 4) if prompt else None


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per arm (and tree): means over the rounds; each kvgate row's busy CPU against the anchor's
    in its own round (geometric mean of the rounds' ratios, 95% interval)."""
    out: dict[str, Any] = {}
    anchor = {r["round"]: r["busy_cpu_ms_per_request"] for r in rows if r["arm"] == ANCHOR}
    labels = dict.fromkeys((r["arm"], r["tree"]) for r in rows)
    for arm, tree in labels:
        mine = [r for r in rows if r["arm"] == arm and r["tree"] == tree]
        key = arm if arm == ANCHOR or tree == "installed" else f"{arm}@{tree}"
        row: dict[str, Any] = {
            "rounds": len(mine),
            "errors": sum(r["errors"] for r in mine),
            **{
                f"{field}_mean": round(statistics.fmean(r[field] for r in mine), 3)
                for field in ("cpu_ms_per_request", "busy_cpu_ms_per_request", "idle_cpu_ms_per_s")
            },
        }
        if arm != ANCHOR and anchor:
            common = [r for r in mine if r["round"] in anchor]
            ratio = paired_ratio([r["busy_cpu_ms_per_request"] for r in common], [anchor[r["round"]] for r in common])
            if ratio is not None:
                row[f"busy_over_{ANCHOR}"] = ratio
        out[key] = row
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from kvgate.engines.vllm.launch import default_model_dir

    log = say("router-cpu")
    args.tokenizer = str(default_model_dir())
    if not (Path(args.tokenizer) / "tokenizer.json").is_file():
        raise SystemExit(f"kvgate bench router-cpu: no SmolLM2 model dir at {args.tokenizer} (run `kvgate prepare`)")
    convs, counts = usable(args)
    if len(convs) < args.conversations:
        raise SystemExit(f"kvgate bench router-cpu: {args.trace} has {len(convs)} usable conversations ({counts})")
    texts = [user_texts(c, args.block_tokens) for c in convs[: args.conversations]]
    arms = [a for a in args.arms.split(",") if a]
    trees = [t.strip() for t in args.trees.split(",") if t.strip()] or [""]
    work = Path(tempfile.mkdtemp(prefix="kvgate-router-cpu-"))
    log(f"{len(texts)} conversations × {args.turns} turns per run, arms {arms}, trees {trees}, logs in {work}")
    rows = []
    for r in range(args.rounds):
        for arm in arms:
            for t, tree in enumerate(trees if arm != ANCHOR else [""]):
                row = {"round": r + 1, **one_run(arm, tree, texts, args, work / f"round{r + 1}-{arm}-{t}")}
                log(
                    f"round {r + 1} {arm} {row['tree']}: {row['cpu_ms_per_request']} ms CPU per request "
                    f"(busy {row['busy_cpu_ms_per_request']}, idle {row['idle_cpu_ms_per_s']} ms/s), "
                    f"{row['errors']} errors"
                )
                rows.append(row)
    return {
        "bench": "router_cpu",
        "conversations": len(texts),
        "requests_per_run": sum(len(t) for t in texts),
        "engines": {
            "kind": "kvgate sim-replica",
            "block_size": BLOCK_SIZE,
            "capacity_tokens": KV_CACHE_TOKENS,
            "decode_tps": args.decode_tps,
            "prefill_tps": args.prefill_tps,
            "tokenizer": args.tokenizer,
        },
        "anchor_thresholds": args.anchor,
        "runs": rows,
        "summary": summarize(rows),
    }


def main(args: argparse.Namespace) -> int:
    bad = validate(args)
    if bad:
        print("kvgate bench router-cpu: " + "; ".join(bad), flush=True)
        return 2
    result = run(args)
    for label, row in result["summary"].items():
        ratio = row.get(f"busy_over_{ANCHOR}")
        against = ""
        if ratio is not None:
            interval = ratio.get("ci95")
            span = f" ({interval[0]}–{interval[1]})" if interval else ""
            against = f", {ratio['ratio']}×{span} sglang-router's"
        print(
            f"{label}: {row['cpu_ms_per_request_mean']} ms CPU per request, busy {row['busy_cpu_ms_per_request_mean']}"
            f"{against}; {row['errors']} errors"
        )
    write_json(args.json, result)
    return 0 if all(r["errors"] == 0 for r in result["runs"]) else 1
