"""`kvgate bench loop-load`: long streamed prompts through `kvgate serve`; what the proxy's event
loop and CPU pay per request.

N workers each hold multi-turn conversations whose system prompt is a fresh document of
`--prompt-words` random words (≈1.6 SmolLM2 tokens a word), so every conversation's first turn is
a cold prompt and later turns grow it. The route is the one the hot path is about: replicas behind
the router (cache_aware, approximate mode, record_answers, the chosen tokenizer) and the exact tier
on (semantic off: embedding is its own cost). Replicas are demo backends (`kvgate demo-backend`):
short answers, no model, so the proxy is the only thing working per request.

Reported per proxy: client TTFT, requests/s, the proxy's CPU seconds per request (/proc), and its
event-loop lag (`kvgate_event_loop_lag_seconds`, scraped at the end). `--anchor-tree DIR` first
runs the same workload against a proxy started from another source tree (e.g. `git archive` of an
older commit) so the two are compared within one run.

`--rate R` measures the router's overhead instead (open loop: a request every 1/R s
whatever the answers do): one instant backend, one proxy per tokenizer (`--tokenizers`) with it as
the only replica, and per prompt shape (`--shapes`: `fresh` = a new document every request,
`continue` = the next turn of one of `--conversations` conversations, the prompt-prefix cache's
case) the same requests sent to the backend directly and then through the proxy. Added latency =
proxy − direct, percentile by percentile (TTFT and total), with the proxy's loop lag over its phase
and the time one fresh prompt takes to render + tokenise + hash in this process (`hash_ms`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from kvgate.middleware.forward.http1 import Pool
from kvgate.tools.bench.loop_load_proxy import config, cpu_s, lag_between, lag_histogram, start_spy, stop_spy
from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv
from kvgate.tools.bench.stats import pct, write_json
from kvgate.tools.bench.stream_client import timed_stream
from kvgate.tools.bench.workdir import tidied


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=240, help="requests per proxy")
    p.add_argument("--concurrency", type=int, default=24, help="conversations in flight")
    p.add_argument("--turns", type=int, default=3, help="turns per conversation")
    p.add_argument("--prompt-words", type=int, default=5000, help="words of each conversation's system prompt")
    p.add_argument("--tokenizer", default="smollm2", help="routing tokenizer: smollm2 | text")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--anchor-tree", type=Path, default=None, help="also run a proxy from this source tree, first")
    p.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="PREFIX",
        help="record each proxy with py-spy (raw stacks to PREFIX-<label>.txt; --rate: PREFIX-<tokenizer>-<shape>.txt, proxy phase only)",
    )
    p.add_argument("--rate", type=float, default=0.0, help="open-loop requests/s: the router-overhead figure (0: off)")
    p.add_argument("--duration-s", type=float, default=15.0, help="--rate: seconds per phase")
    p.add_argument("--tokenizers", default="smollm2,text", help="--rate: one proxy per routing tokenizer")
    p.add_argument("--shapes", default="fresh,continue", help="--rate: prompt shapes (fresh | continue)")
    p.add_argument("--conversations", type=int, default=20, help="--rate, continue: conversations taking turns")
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="--rate: routing.prefix.block_size of the proxies (default: the route's default for the tokenizer)",
    )
    p.add_argument("--json", type=Path, default=None)


def _words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(n))


async def drive(url: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """`args.requests` streamed requests from `args.concurrency` workers; TTFT per request."""
    rng = random.Random(seed)
    ttfts: list[float] = []
    errors: list[str] = []
    left = [args.requests]

    async def worker(client: httpx.AsyncClient, w: int) -> None:
        while left[0] > 0:
            messages = [{"role": "system", "content": _words(rng, args.prompt_words)}]
            for turn in range(args.turns):
                if left[0] <= 0:
                    return
                left[0] -= 1
                messages.append({"role": "user", "content": f"worker {w} turn {turn}: {_words(rng, 12)}?"})
                sent, first, text = time.perf_counter(), None, []
                body = {"model": "demo", "messages": messages, "stream": True, "max_tokens": 64}
                try:
                    async with client.stream("POST", url, json=body) as resp:
                        if resp.status_code != 200:
                            errors.append(f"HTTP {resp.status_code}")
                            return
                        async for line in resp.aiter_lines():
                            if line.startswith("data: {") and first is None:
                                first = time.perf_counter() - sent
                            if '"content"' in line:
                                text.append(line)
                except httpx.HTTPError as exc:
                    errors.append(type(exc).__name__)
                    return
                if first is not None:
                    ttfts.append(first)
                messages.append({"role": "assistant", "content": f"answer {turn} of worker {w}"})

    limits = httpx.Limits(max_connections=args.concurrency * 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client, w) for w in range(args.concurrency)))
        wall = time.perf_counter() - started
    return {"ttfts": ttfts, "errors": errors, "wall_s": wall}


def run_one(label: str, tree: Path | None, replicas: list[str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    port = free_port()
    cfg_path = work / f"{label}.yaml"
    cfg_path.write_text(yaml.safe_dump(config(replicas, args.tokenizer, str(work / f"cache-{label}"))))
    # PYTHONSAFEPATH: `python -m` must not put the current directory (this tree) first on the path
    env = {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"} if tree is not None else None
    proxy = Proc(
        f"proxy-{label}",
        kvgate_argv("serve", "--config", str(cfg_path), "--port", str(port), "--log-level", "warning"),
        work,
        env=env,
    )
    spy = None
    try:
        base = f"http://127.0.0.1:{port}"
        proxy.wait_http(f"{base}/health")
        if args.py_spy is not None:
            spy = start_spy(proxy.proc.pid, Path(f"{args.py_spy}-{label}.txt"))
        # warm-up: LiteLLM's lazy imports (its tokenizer for cost, loaded on first use) stay out of the figures
        asyncio.run(
            drive(
                f"{base}/v1/chat/completions",
                argparse.Namespace(**{**vars(args), "requests": 4, "concurrency": 2}),
                seed=1,
            )
        )
        lag0 = lag_histogram(httpx.get(f"{base}/metrics", timeout=30).text)
        cpu0 = cpu_s(proxy.proc.pid)
        run = asyncio.run(drive(f"{base}/v1/chat/completions", args, seed=7))
        cpu = cpu_s(proxy.proc.pid) - cpu0
        lag = lag_between(lag0, lag_histogram(httpx.get(f"{base}/metrics", timeout=30).text))
    finally:
        stop_spy(spy)
        proxy.stop()
    t = run["ttfts"]
    return {
        "tree": str(tree) if tree else "this",
        "completed": len(t),
        "errors": len(run["errors"]),
        "req_per_s": len(t) / run["wall_s"],
        "ttft_p50_ms": 1000 * pct(t, 0.5),
        "ttft_p99_ms": 1000 * pct(t, 0.99),
        "ttft_mean_ms": 1000 * statistics.fmean(t) if t else float("nan"),
        "proxy_cpu_ms_per_req": 1000 * cpu / max(1, len(t)),
        "loop_lag": lag,
    }


def main(args: argparse.Namespace) -> int:
    if args.rate > 0:
        return run_overhead(args)
    work = Path(tempfile.mkdtemp(prefix="kvgate-loopload-"))
    backends, urls = [], []
    try:
        for i in range(args.replicas):
            port = free_port()
            backends.append(Proc(f"demo-{i}", kvgate_argv("demo-backend", "--port", str(port)), work))
            urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(backends, urls):
            proc.wait_http(f"{url}/v1/models")
        result: dict[str, Any] = {
            "args": {k: str(v) for k, v in vars(args).items() if k != "func"},
            "machine": {"cpus": os.cpu_count()},
            "runs": {},
        }
        if args.anchor_tree is not None:
            result["runs"]["anchor"] = run_one("anchor", args.anchor_tree.resolve(), urls, args, work)
        result["runs"]["this"] = run_one("this", None, urls, args, work)
    finally:
        for proc in backends:
            proc.stop()
        print(f"[loop-load] {tidied(work)}", file=sys.stderr, flush=True)
    print(
        f"{'proxy':8s} {'req/s':>7s} {'ttft p50':>9s} {'p99':>8s} {'cpu/req':>8s} {'lag mean':>9s} {'p99≤':>7s} {'>10ms':>6s} err"
    )
    for name, r in result["runs"].items():
        lag = r["loop_lag"]
        print(
            f"{name:8s} {r['req_per_s']:7.1f} {r['ttft_p50_ms']:7.0f}ms {r['ttft_p99_ms']:6.0f}ms "
            f"{r['proxy_cpu_ms_per_req']:6.1f}ms {lag['mean_ms']:7.1f}ms {lag['p99_le_ms']:5.0f}ms "
            f"{lag['share_over_10ms']:6.1%} {r['errors']}"
        )
    write_json(args.json, result)
    return 0


# ------------------------------------------------------------------ --rate: the router-overhead figure


class Prompts:
    """The request bodies of one phase, made before it starts (so making them costs no latency)."""

    def __init__(self, shape: str, args: argparse.Namespace, count: int, seed: int) -> None:
        rng = random.Random(seed)
        vocab = [_words(rng, 1) for _ in range(5000)]
        words = max(1, int(args.prompt_words))
        self.bodies: list[list[dict[str, str]]] = []
        if shape == "fresh":
            for i in range(count):
                self.bodies.append(
                    [
                        {"role": "system", "content": " ".join(rng.choices(vocab, k=words))},
                        {"role": "user", "content": f"question {i}?"},
                    ]
                )
            self.warm: list[list[dict[str, str]]] = []
            return
        # continue: conversation c's turn t repeats turns 0..t-1 (question + the demo backend's echo)
        talks = [
            [{"role": "system", "content": " ".join(rng.choices(vocab, k=words))}] for _ in range(args.conversations)
        ]
        self.warm = []
        for c, talk in enumerate(talks):  # turn 0 of each is sent before timing: its cold hash is `fresh`'s case
            talk.append({"role": "user", "content": f"conversation {c} turn 0?"})
            self.warm.append(list(talk))
        for i in range(count):
            c, talk = i % len(talks), talks[i % len(talks)]
            turn = (len(talk) - 1) // 2
            talk.append({"role": "assistant", "content": f"Answer: {talk[-1]['content']}"})
            talk.append({"role": "user", "content": f"conversation {c} turn {turn}?"})
            self.bodies.append(list(talk))


async def open_loop(url: str, bodies: list[list[dict[str, str]]], rate: float) -> dict[str, Any]:
    """Request i at t0 + i/rate (whatever the earlier ones are doing); TTFT and total per request,
    read with the same client for the backend and the proxy (tools/bench/stream_client.py)."""
    ttft: list[float] = []
    total: list[float] = []
    errors: list[str] = []
    client = Pool(keepalive_s=3.0)

    async def one(messages: list[dict[str, str]], at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        body = orjson.dumps({"model": "demo", "messages": messages, "stream": True, "max_tokens": 64})
        got = await timed_stream(client, url, body, {}, 300.0)
        if got.error is not None:
            errors.append(got.error)
            return
        total.append(got.total)
        ttft.append(got.ttft)

    try:
        t0 = time.perf_counter() + 0.2
        await asyncio.gather(*(one(m, t0 + i / rate) for i, m in enumerate(bodies)))
        wall = time.perf_counter() - t0
    finally:
        await client.aclose()
    return {"ttft": ttft, "total": total, "errors": errors, "wall_s": wall}


def _summary(run: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "completed": len(run["total"]),
        "errors": len(run["errors"]),
        "req_per_s": len(run["total"]) / run["wall_s"],
    }
    for key in ("ttft", "total"):
        for q in (0.5, 0.9, 0.99):
            out[f"{key}_p{round(q * 100)}_ms"] = 1000 * pct(run[key], q)
    return out


def hash_ms(tokenizer: str, prompts: Prompts, block_size: int, n: int = 10) -> dict[str, Any]:
    """Render + tokenise + hash of fresh prompts with the router's own hasher: p50 ms and token count."""
    from kvgate.index.kv.prompt import PromptHasher
    from kvgate.index.kv.tokenizer import load_tokenizer

    hasher = PromptHasher(load_tokenizer(tokenizer), block_size)
    times, tokens = [], 0
    for messages in prompts.bodies[:n]:
        started = time.perf_counter()
        tokens = hasher.prompt(messages).tokens
        times.append(time.perf_counter() - started)
    return {"hash_ms_p50": 1000 * pct(times, 0.5), "tokens": tokens}


def run_overhead(args: argparse.Namespace) -> int:
    from kvgate.middleware.config import PrefixConfig

    work = Path(tempfile.mkdtemp(prefix="kvgate-overhead-"))
    count = int(args.rate * args.duration_s)
    port = free_port()
    backend_url = f"http://127.0.0.1:{port}"
    backend = Proc("demo", kvgate_argv("demo-backend", "--port", str(port)), work)
    result: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items() if k != "func"},
        "machine": {"cpus": os.cpu_count()},
        "runs": [],
    }
    try:
        backend.wait_http(f"{backend_url}/v1/models")
        for tokenizer in [t.strip() for t in args.tokenizers.split(",") if t.strip()]:
            cfg_path = work / f"{tokenizer}.yaml"
            block_size = args.block_size or PrefixConfig(tokenizer=tokenizer).block_size  # the route's default
            cfg_path.write_text(
                yaml.safe_dump(config([backend_url], tokenizer, str(work / f"cache-{tokenizer}"), block_size))
            )
            proxy_port = free_port()
            proxy = Proc(
                f"proxy-{tokenizer}",
                kvgate_argv("serve", "--config", str(cfg_path), "--port", str(proxy_port), "--log-level", "warning"),
                work,
            )
            base = f"http://127.0.0.1:{proxy_port}"
            try:
                proxy.wait_http(f"{base}/health")
                for n, shape in enumerate(s.strip() for s in args.shapes.split(",") if s.strip()):
                    prompts = Prompts(shape, args, count, seed=100 + n)
                    row: dict[str, Any] = {
                        "tokenizer": tokenizer,
                        "shape": shape,
                        "rate": args.rate,
                        "block_size": block_size,
                        **hash_ms(tokenizer, Prompts("fresh", args, 10, seed=7), block_size),
                    }
                    for label, url in (("direct", backend_url), ("proxy", base)):
                        # warm-up: connections, lazy imports, and (continue) each conversation's first turn
                        warm = prompts.warm or Prompts("fresh", args, 8, seed=9).bodies
                        asyncio.run(open_loop(f"{url}/v1/chat/completions", warm, args.rate))
                        lag0 = lag_histogram(httpx.get(f"{base}/metrics", timeout=30).text)
                        cpu0 = cpu_s(proxy.proc.pid)
                        spy = (
                            start_spy(proxy.proc.pid, Path(f"{args.py_spy}-{tokenizer}-{shape}.txt"))
                            if args.py_spy is not None and label == "proxy"
                            else None
                        )
                        try:
                            run = asyncio.run(open_loop(f"{url}/v1/chat/completions", prompts.bodies, args.rate))
                        finally:
                            stop_spy(spy)
                        row[label] = _summary(run)
                        if label == "proxy":
                            row["proxy_cpu_ms_per_req"] = (
                                1000 * (cpu_s(proxy.proc.pid) - cpu0) / max(1, len(run["total"]))
                            )
                            row["loop_lag"] = lag_between(
                                lag0, lag_histogram(httpx.get(f"{base}/metrics", timeout=30).text)
                            )
                    row["added_ms"] = {
                        k: row["proxy"][k] - row["direct"][k] for k in row["direct"] if k.endswith("_ms")
                    }
                    result["runs"].append(row)
                    print(
                        f"[overhead] {tokenizer} {shape}: added {row['added_ms']} lag {row['loop_lag']}",
                        file=sys.stderr,
                        flush=True,
                    )
            finally:
                proxy.stop()
    finally:
        backend.stop()
        print(f"[overhead] {tidied(work)}", file=sys.stderr, flush=True)
    print(
        f"{'tokenizer':9s} {'shape':9s} {'tokens':>6s} {'hash':>7s} {'+ttft p50':>9s} {'p99':>7s} {'+total p50':>10s} "
        f"{'p99':>7s} {'lag p99≤':>8s} {'cpu/req':>7s} err"
    )
    for r in result["runs"]:
        a, lag = r["added_ms"], r["loop_lag"]
        print(
            f"{r['tokenizer']:9s} {r['shape']:9s} {r['tokens']:6d} {r['hash_ms_p50']:5.1f}ms {a['ttft_p50_ms']:7.2f}ms "
            f"{a['ttft_p99_ms']:5.1f}ms {a['total_p50_ms']:8.2f}ms {a['total_p99_ms']:5.1f}ms {lag['p99_le_ms']:6.0f}ms "
            f"{r['proxy_cpu_ms_per_req']:5.1f}ms {r['proxy']['errors'] + r['direct']['errors']}"
        )
    write_json(args.json, result)
    return 0
