"""`kvgate bench throughput`: requests/s and latency of one proxy process under concurrent load.

The question: is the proxy, not the replicas, the bottleneck? Every target sits in front
of the same instant backend (`kvgate demo-backend`, its own process) and gets the same load in the
same run, one target at a time:

- `kvgate_relay` / `kvgate_litellm`: one `kvgate serve` process, the backend as the route's only
  replica (cache_aware routing, exact tier on, semantic tier off), misses forwarded by the relay
  (`routing.forward: relay`) or by litellm.acompletion (`routing.forward: litellm`);
- `kvgate_relay_w2`: the relay with `kvgate serve --workers 2` (one port, routing state shared);
- `kvgate_router`: the relay's route with its response cache off (`exact: false`, semantic off):
  prefix-aware routing and nothing stored, the job sglang-router does (its hit-heavy mix is
  all misses);
- `kvgate_backend`: one `kvgate serve` process with the backend as the route's one `backend`
  (`api_base`, no replicas, so no routing; README's config), relayed;
- `litellm_proxy`: LiteLLM's own proxy (`litellm --config`, one worker, its in-memory cache on);
- `sglang_router`: `sglang-router launch` (cache_aware), all-miss mix only: it has no cache;
- `direct`: the backend itself, all-miss mix only: the ceiling of the machine.

Mixes: `hit_heavy` (after a warm-up that stores a pool of answers, --repeat-share of the requests
repeat a stored one: exact hits where the target caches) and `all_miss` (every request new).
Requests carry one of 8 long system prompts (--system-words) and a fresh question
(--question-words; the backend echoes it, so streamed answers are that many chunks); --stream-share
of them stream. Each cell sends at most --requests requests or runs --duration-s seconds, C at a
time, from one aiohttp client in this process. Loopback only. The result (`--json`) has one row per
(mix, concurrency, target) and the ratios the issue's goals are stated in. Each row also has the
CPU milliseconds per completed request, over the timed phase, of the target (its whole process
group: every worker), of the backend and of this client: on a small machine the three share the
cores, and these say where they go.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from kvgate.middleware.progress import say
from kvgate.tools.bench.machine import machine_info
from kvgate.tools.bench.procs import Proc, free_port, group_cpu_s, kvgate_argv
from kvgate.tools.bench.stats import percentiles_ms, write_json
from kvgate.tools.bench.throughput_servers import MASTER_KEY, MODEL, start, wait_ready
from kvgate.tools.bench.workdir import tidied

SCHEMA = 1
TARGETS = (
    "kvgate_relay",
    "kvgate_relay_w2",
    "kvgate_router",
    "kvgate_backend",
    "kvgate_litellm",
    "litellm_proxy",
    "sglang_router",
    "direct",
)
MISS_ONLY = frozenset({"sglang_router", "direct"})  # no cache: a hit-heavy mix is an all-miss mix to them
MIXES = ("hit_heavy", "all_miss")
SYSTEM_PROMPTS = 8
WORDS = tuple(
    "amber basalt cinder delta ember fjord garnet harbor indigo juniper kelp lagoon meadow nectar onyx prairie"
    " quartz russet sierra tundra umber valley willow xylem yarrow zephyr acorn bramble cobalt dune estuary flint".split()
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=3000, help="most requests per cell (mix × concurrency × target)")
    p.add_argument("--duration-s", type=float, default=20.0, help="most seconds per cell")
    p.add_argument("--warmup", type=int, default=200, help="requests before timing (connections; the hit mix's pool)")
    p.add_argument("--concurrency", default="32,128", help="comma list of concurrent clients")
    p.add_argument("--mixes", default=",".join(MIXES))
    p.add_argument("--targets", default=",".join(TARGETS), help=f"comma list of {','.join(TARGETS)}")
    p.add_argument(
        "--repeat-share", type=float, default=0.9, help="hit_heavy: share of requests repeating a stored one"
    )
    p.add_argument("--stream-share", type=float, default=0.5)
    p.add_argument("--system-words", type=int, default=400, help="words of each long system prompt")
    p.add_argument("--question-words", type=int, default=16, help="words of each question (= streamed chunks)")
    p.add_argument(
        "--chunk-gap-ms",
        type=int,
        default=0,
        help="the backend's milliseconds between a stream's chunks (0: back to back, several may share a read)",
    )
    p.add_argument(
        "--tokenizer",
        default="text",
        help="kvgate's routing tokenizer (text: the config default, characters like sglang-router's tree | smollm2)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=None, help="configs, logs and caches (default: a temp dir)")
    p.add_argument("--json", type=Path, default=None)


class Workload:
    """The requests of one cell: a long system prompt and a question unique to this cell."""

    def __init__(self, tag: str, args: argparse.Namespace, seed: int) -> None:
        self.tag, self.rng = tag, random.Random(seed)
        self.question_words, self.stream_share = args.question_words, args.stream_share
        base = random.Random(args.seed)
        self.systems = [
            f"You are assistant {i}. " + " ".join(base.choices(WORDS, k=args.system_words))
            for i in range(SYSTEM_PROMPTS)
        ]
        self.pool: list[tuple[int, str, bool]] = []  # answered requests a hit-heavy mix repeats
        self.made = 0

    def new(self) -> tuple[int, str, bool]:
        self.made += 1
        words = " ".join(self.rng.choices(WORDS, k=self.question_words - 2))
        return (
            self.rng.randrange(SYSTEM_PROMPTS),
            f"{self.tag} q{self.made}: {words}",
            self.rng.random() < self.stream_share,
        )

    def next(self, repeat_share: float) -> tuple[tuple[int, str, bool], bool]:
        """(request, whether it repeats a stored one)."""
        if self.pool and self.rng.random() < repeat_share:
            return self.rng.choice(self.pool), True
        return self.new(), False

    def body(self, request: tuple[int, str, bool]) -> bytes:
        system, question, stream = request
        messages = [{"role": "system", "content": self.systems[system]}, {"role": "user", "content": question}]
        return json.dumps({"model": MODEL, "messages": messages, "stream": stream}).encode()


def hit_of(target: str, headers: Any) -> bool | None:
    """Whether the target says it served from its cache (None: it has none)."""
    if target.startswith("kvgate"):
        return headers.get("x-kvgate-cache", "miss") != "miss"
    if target == "litellm_proxy":
        return "x-litellm-cache-key" in headers
    return None


async def drive(
    url: str,
    target: str,
    work: Workload,
    mix: str,
    args: argparse.Namespace,
    concurrency: int,
    cpu: Callable[[], dict[str, float]] = dict,
) -> dict[str, Any]:
    """Warm up, then send one cell's load; latency is send → last byte of the answer."""
    import aiohttp  # LiteLLM's own dependency; a faster client than httpx, so the client costs less CPU

    repeat = args.repeat_share if mix == "hit_heavy" and target not in MISS_ONLY else 0.0
    headers = {"content-type": "application/json", "authorization": f"Bearer {MASTER_KEY}"}
    latencies: list[float] = []
    counts = {"ok": 0, "errors": 0, "hits": 0, "repeats": 0}
    problems: list[str] = []

    async def one(session: Any, request: tuple[int, str, bool], timed: bool, repeated: bool) -> None:
        started = time.perf_counter()
        try:
            async with session.post(url, data=work.body(request), headers=headers) as resp:
                body = await resp.read()
                ok = resp.status == 200 and (
                    not request[2] or (body.rstrip().endswith(b"data: [DONE]") and b'"error"' not in body)
                )
                hit = hit_of(target, resp.headers)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            ok, body, hit = False, repr(exc).encode(), None
        if not timed:
            if ok and not repeated:
                work.pool.append(request)
            return
        latencies.append(time.perf_counter() - started)
        if not ok:
            counts["errors"] += 1
            if len(problems) < 5:
                problems.append(body[:200].decode(errors="replace"))
            return
        counts["ok"] += 1
        counts["hits"] += bool(hit)
        counts["repeats"] += repeated
        if not repeated and repeat:
            work.pool.append(request)

    connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=4.0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        warm = [work.new() for _ in range(args.warmup)]
        sem = asyncio.Semaphore(concurrency)

        async def warm_one(request: tuple[int, str, bool]) -> None:
            async with sem:
                await one(session, request, False, False)

        await asyncio.gather(*(warm_one(r) for r in warm))
        issued, deadline = 0, time.perf_counter() + args.duration_s

        async def worker() -> None:
            nonlocal issued
            while issued < args.requests and time.perf_counter() < deadline:
                issued += 1
                request, repeated = work.next(repeat)
                await one(session, request, True, repeated)

        cpu0, started = cpu(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        cpu1 = cpu()
    # three decimals: a ratio of two routers' figures near 0.3 ms would move by a rounding's 2% at two
    per_request = {f"{k}_cpu_ms_per_req": round(1000 * (cpu1[k] - cpu0[k]) / max(1, counts["ok"]), 3) for k in cpu0}
    p50, p99 = percentiles_ms(latencies)
    done = counts["ok"] + counts["errors"]
    return {
        "mix": mix,
        "concurrency": concurrency,
        "target": target,
        "requests": done,
        "errors": counts["errors"],
        "elapsed_s": round(elapsed, 2),
        "rps": round(counts["ok"] / elapsed, 1) if elapsed else None,
        "p50_ms": p50,
        "p99_ms": p99,
        "hit_ratio": round(counts["hits"] / counts["ok"], 3)
        if counts["ok"] and hit_of(target, {}) is not None
        else None,
        "repeat_ratio": round(counts["repeats"] / counts["ok"], 3) if counts["ok"] else None,
        **per_request,
        "problems": problems,
    }


# ------------------------------------------------------------------ run
def ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mix and concurrency: each kvgate target's req/s over the anchors'."""
    out: dict[str, Any] = {}
    for row in rows:
        if not row["target"].startswith("kvgate") or not row["rps"]:
            continue
        cell = out.setdefault(row["mix"], {}).setdefault(str(row["concurrency"]), {})
        for anchor in ("litellm_proxy", "sglang_router", "direct"):
            other = next(
                (
                    r
                    for r in rows
                    if r["target"] == anchor
                    and r["mix"] == row["mix"]
                    and r["concurrency"] == row["concurrency"]
                    and r["rps"]
                ),
                None,
            )
            if other is not None:
                cell[f"{row['target']}/{anchor}"] = round(row["rps"] / other["rps"], 3)
                cpu, other_cpu = row.get("proxy_cpu_ms_per_req"), other.get("proxy_cpu_ms_per_req")
                if cpu and other_cpu:  # the proxies' CPU per request (`direct` has no proxy)
                    cell[f"{row['target']}/{anchor}_cpu"] = round(cpu / other_cpu, 3)
    return out


def goals(table: dict[str, Any]) -> dict[str, bool | None]:
    """The issue's goals, for the relay (None where an anchor did not run)."""
    vs_litellm = [c.get("kvgate_relay/litellm_proxy") for mix in table.values() for c in mix.values()]
    vs_sglang = [c.get("kvgate_relay/sglang_router") for c in table.get("all_miss", {}).values()]
    w2_sglang = [c.get("kvgate_relay_w2/sglang_router") for c in table.get("all_miss", {}).values()]
    vs_litellm, vs_sglang = [x for x in vs_litellm if x is not None], [x for x in vs_sglang if x is not None]
    w2_sglang = [x for x in w2_sglang if x is not None]
    c32 = table.get("all_miss", {}).get("32", {})
    rps_32, cpu_32 = c32.get("kvgate_relay/sglang_router"), c32.get("kvgate_relay/sglang_router_cpu")
    # kvgate_router does sglang-router's job (routes, caches no response): the like-for-like cell
    router_rps, router_cpu = c32.get("kvgate_router/sglang_router"), c32.get("kvgate_router/sglang_router_cpu")
    return {
        # all-miss at C=32: at least sglang-router's req/s, at most 1.5x its CPU per request
        "relay_all_miss_c32_at_least_sglang_router": rps_32 >= 1 if rps_32 is not None else None,
        "relay_all_miss_c32_cpu_at_most_1_5x_sglang_router": cpu_32 <= 1.5 if cpu_32 is not None else None,
        "relay_at_least_2x_litellm_proxy": all(x >= 2 for x in vs_litellm) if vs_litellm else None,
        "relay_all_miss_at_least_half_sglang_router": all(x >= 0.5 for x in vs_sglang) if vs_sglang else None,
        "relay_w2_all_miss_at_least_half_sglang_router": all(x >= 0.5 for x in w2_sglang) if w2_sglang else None,
        "router_all_miss_c32_at_least_sglang_router": router_rps >= 1 if router_rps is not None else None,
        "router_all_miss_c32_cpu_at_most_1_5x_sglang_router": router_cpu <= 1.5 if router_cpu is not None else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="kvgate-throughput-"))
    work.mkdir(parents=True, exist_ok=True)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    mixes = [m.strip() for m in args.mixes.split(",") if m.strip()]
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    unknown = [t for t in targets if t not in TARGETS] + [m for m in mixes if m not in MIXES]
    if unknown:
        raise SystemExit(f"kvgate bench throughput: unknown target or mix {unknown}")
    if args.chunk_gap_ms < 0:
        raise SystemExit(f"kvgate bench throughput: --chunk-gap-ms must be at least 0, got {args.chunk_gap_ms}")
    log = say("throughput")
    backend_port = free_port()
    backend = f"http://127.0.0.1:{backend_port}"
    gap = ("--chunk-gap-ms", str(args.chunk_gap_ms))
    procs: list[Proc] = [Proc("backend", kvgate_argv("demo-backend", "--port", str(backend_port), *gap), work)]
    urls: dict[str, str] = {}
    skipped: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    try:
        procs[0].wait_http(f"{backend}/health")
        started = {t: start(t, work, backend, args) for t in targets}
        for target, got in started.items():
            if isinstance(got, str):
                skipped[target] = got
                continue
            proc, urls[target] = got
            if proc is not None:
                procs.append(proc)
        for target in urls:
            wait_ready(next((p for p in procs if p.name == target), None), urls[target])
        log(f"ready: {', '.join(urls)}" + (f"; skipped: {skipped}" if skipped else ""))
        cell = 0
        for mix in mixes:
            for concurrency in levels:
                for target in urls:
                    if mix == "hit_heavy" and target in MISS_ONLY:
                        continue
                    cell += 1
                    work_load = Workload(f"c{cell}", args, args.seed * 1000 + cell)
                    target_proc = next((p for p in procs if p.name == target), None)
                    groups = {"proxy": target_proc, "backend": procs[0]}

                    def cpu() -> dict[str, float]:
                        used = {k: group_cpu_s(p.proc.pid) for k, p in groups.items() if p is not None}
                        return {**used, "client": sum(os.times()[:2])}

                    row = asyncio.run(
                        drive(f"{urls[target]}/v1/chat/completions", target, work_load, mix, args, concurrency, cpu)
                    )
                    rows.append(row)
                    log(
                        f"{mix:9s} c={concurrency:<4d} {target:15s} {row['rps']} req/s p50 {row['p50_ms']} ms "
                        f"p99 {row['p99_ms']} ms errors {row['errors']} hits {row['hit_ratio']}"
                    )
    finally:
        for proc in reversed(procs):
            proc.stop()
        if not args.workdir:  # a directory the user named stays whole
            log(tidied(work))
    table = ratios(rows)
    return {
        "bench": "throughput",
        "schema": SCHEMA,
        "machine": machine_info(),
        "params": {
            k: getattr(args, k)
            for k in (
                "requests",
                "duration_s",
                "warmup",
                "concurrency",
                "repeat_share",
                "stream_share",
                "system_words",
                "question_words",
                "chunk_gap_ms",
                "tokenizer",
                "seed",
            )
        },
        "targets": {t: ("skipped: " + skipped[t]) if t in skipped else "ran" for t in targets},
        "rows": rows,
        "ratios": table,
        "goals": goals(table),
        "workdir": str(work),
    }


def main(args: argparse.Namespace) -> int:
    result = run(args)
    print(
        f"{'mix':9s} {'conc':>4s} {'target':15s} {'req/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'hits':>5s} {'errors':>6s}"
        "   CPU ms/req: target backend client"
    )
    for r in result["rows"]:
        hits = "-" if r["hit_ratio"] is None else f"{r['hit_ratio']:.2f}"
        cpu = "  ".join(f"{r.get(k + '_cpu_ms_per_req', float('nan')):6.3f}" for k in ("proxy", "backend", "client"))
        print(
            f"{r['mix']:9s} {r['concurrency']:4d} {r['target']:15s} {r['rps'] or 0:8.1f} {r['p50_ms'] or 0:8.1f} "
            f"{r['p99_ms'] or 0:8.1f} {hits:>5s} {r['errors']:6d}   {cpu}"
        )
    for mix, cells in result["ratios"].items():
        for concurrency, values in cells.items():
            print(f"{mix} c={concurrency}: " + "  ".join(f"{k} {v}x" for k, v in values.items()))
    print("goals:", result["goals"], "| skipped:", {k: v for k, v in result["targets"].items() if v != "ran"} or "none")
    write_json(args.json, result)
    return 0 if all(r["errors"] == 0 for r in result["rows"]) else 1
