"""The routing arena's measurements: replay a slice of a trace through one router, sample the
queues while it runs, summarise, and the LRU ceilings of the slice.

TTFT is the time to the first content chunk as the client sees it, router included, read with
tools/bench/stream_client.py's client (the same for every router); each load-generator process
also reports its own event-loop lag (`client_lag_p99_s`), a delay it adds to the TTFTs it measures. Hit rate,
request counts and queues come from the replicas' own /stats, so every router is judged by the
same engine. Percentiles are tools/bench/stats.py's `pct` (nearest rank), everywhere.
"""

from __future__ import annotations

import asyncio
import io
import multiprocessing
import re
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Sequence

import httpx
import orjson

from kvgate.engines.sim.base import matchable
from kvgate.engines.sim.engine import PrefixCache, SimEngine
from kvgate.middleware.forward.http1 import Pool
from kvgate.middleware.progress import Progress
from kvgate.middleware.telemetry.loop_lag import watch_loop_lag
from kvgate.tools.bench.stats import pct
from kvgate.tools.bench.stream_client import answered, timed_stream
from kvgate.tools.bench.trace import TraceRequest

BLOCK_SIZE = 16
CLIENT_START_S = 3.0  # lead time for `clients` > 1: spawned processes import the client and the trace code
_PENDING = re.compile(r"^kvgate_replica_pending_prefill_tokens\{([^}]*)\}\s+([0-9.eE+-]+)$", re.M)


def pooled_hits(requests: Sequence[Any], capacity_blocks: int) -> list[int]:
    """Cached tokens of each request (anything with `hashes` and `prompt_tokens`, in order) in one
    LRU of `capacity_blocks` blocks of BLOCK_SIZE tokens."""
    cache, out = PrefixCache(capacity_blocks), []
    for r in requests:
        out.append(cache.match(matchable(r.hashes, r.prompt_tokens, BLOCK_SIZE)) * BLOCK_SIZE)
        cache.insert(list(r.hashes))
    return out


def ceilings(prompts: Sequence[str], total_capacity_tokens: int) -> dict[str, float]:
    """Hit rate of one unlimited and one bounded LRU cache over the requests in order."""
    engine = SimEngine(capacity_tokens=1, block_size=BLOCK_SIZE, prefill_tps=1, decode_tps=1)
    reqs = [engine.request([{"role": "user", "content": text}]) for text in prompts]
    tokens = sum(r.prompt_tokens for r in reqs)
    return {
        "ceiling_infinite": sum(pooled_hits(reqs, 10**12)) / tokens,
        "ceiling_lru": sum(pooled_hits(reqs, total_capacity_tokens // BLOCK_SIZE)) / tokens,
    }


def parse_pending(metrics_text: str) -> dict[str, float]:
    """kvgate's /metrics → {replica: pending prefill tokens} (the queue its cache_aware policy sees)."""
    out: dict[str, float] = {}
    for labels, value in _PENDING.findall(metrics_text):
        m = re.search(r'replica="([^"]*)"', labels)
        if m:
            out[m.group(1)] = float(value)
    return out


async def sample_queues(
    replica_urls: list[str], proxy_url: str | None, interval: float, stop: asyncio.Event, into: list[dict[str, Any]]
) -> None:
    """Every `interval` s until `stop`: each replica's queued_prefill_tokens (what it really has
    to prefill) and, for kvgate, the router's pending_prefill_tokens estimate of the same."""
    async with httpx.AsyncClient(timeout=5.0) as client:
        while not stop.is_set():
            try:
                stats = await asyncio.gather(*(client.get(f"{u}/stats") for u in replica_urls))
                row: dict[str, Any] = {"replica": [s.json().get("queued_prefill_tokens", 0) for s in stats]}
                if proxy_url is not None:
                    pending = parse_pending((await client.get(f"{proxy_url}/metrics")).text)
                    row["router"] = [pending.get(f"r{i}", 0.0) for i in range(len(replica_urls))]
                into.append(row)
            except (httpx.HTTPError, ValueError):
                pass
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except asyncio.TimeoutError:
                pass


def queue_check(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The router's queued(r) estimate against the replicas' own figure, over the samples."""
    rep = [q for s in samples for q in s["replica"]]
    out: dict[str, Any] = {
        "samples": len(samples),
        "replica_queued_mean": statistics.fmean(rep) if rep else 0.0,
        "replica_queued_max": max(rep, default=0),
    }
    pairs = [(r, q) for s in samples if "router" in s for r, q in zip(s["router"], s["replica"])]
    if pairs:
        est, true = sum(r for r, _ in pairs), sum(q for _, q in pairs)
        out.update(
            router_estimate_mean=est / len(pairs),
            mean_abs_error=statistics.fmean(abs(r - q) for r, q in pairs),
            estimate_over_replica=est / true if true else None,
        )
    return out


async def replay(
    url: str | Sequence[str],
    trace: Sequence[TraceRequest],
    prompts: Sequence[str],
    speed: float,
    max_out: int,
    headers: dict[str, str],
    clients: int = 1,
    per_request: bool = False,
) -> dict[str, Any]:
    """Send every request at its (scaled) time from the slice's first; TTFT per request, errors
    counted, never raised. Several `url`s (several proxies): request i goes to url i mod N.

    `clients` > 1 spreads the requests over that many load-generator processes (request i to
    process i mod clients), so that reading hundreds of streams in one Python event loop does
    not delay the TTFT it measures; every process keeps the same schedule. `per_request` adds
    "per_request": [index in the slice, replica, cached tokens, TTFT] of each answered request
    (read from a sim replica's answer: a diagnostic of where a router's hits went)."""
    urls = [url] if isinstance(url, str) else list(url)
    t0 = trace[0].timestamp_ms
    items = list(enumerate(zip(trace, prompts)))
    if clients <= 1:
        return await _replay_part(urls, items, speed, max_out, headers, time.perf_counter(), t0, True, per_request)
    print(f"[arena replay] {len(trace)} requests from {clients} client processes", file=sys.stderr, flush=True)
    start = time.perf_counter() + CLIENT_START_S  # the processes' imports happen before it
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(clients, mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = await asyncio.gather(
            *(
                loop.run_in_executor(
                    pool, _run_part, urls, items[k::clients], speed, max_out, headers, start, t0, False, per_request
                )
                for k in range(clients)
            )
        )
    return {
        "ttfts": [x for p in parts for x in p["ttfts"]],
        "errors": [e for p in parts for e in p["errors"]],
        "wall_s": max(p["wall_s"] for p in parts),
        "client_lag": [x for p in parts for x in p["client_lag"]],
        "per_request": sorted(x for p in parts for x in p["per_request"]),
    }


def _run_part(*args: Any) -> dict[str, Any]:
    """One load-generator process (no progress bar: several would interleave)."""
    return asyncio.run(_replay_part(*args))


async def _replay_part(
    urls: list[str],
    items: list[tuple[int, tuple[TraceRequest, str]]],
    speed: float,
    max_out: int,
    headers: dict[str, str],
    start: float,
    t0: float,
    progress: bool,
    per_request: bool = False,
) -> dict[str, Any]:
    """The requests `items` ((index in the slice, (request, prompt))), each sent at `start` + its
    scaled offset from `t0` (perf_counter: CLOCK_MONOTONIC, one clock for every process here)."""
    ttfts: list[float] = []
    errors: list[str] = []
    answers: list[tuple[int, str | None, int | None, float]] = []
    client = Pool(keepalive_s=3.0)  # the same client for every router (tools/bench/stream_client.py)

    async def one(i: int, req: TraceRequest, text: str) -> None:
        try:
            await asyncio.sleep(max(0.0, (req.timestamp_ms - t0) / 1000 / speed - (time.perf_counter() - start)))
            call: dict[str, Any] = {
                "model": "sim",
                "messages": [{"role": "user", "content": text}],
                "stream": True,
                "max_tokens": max(1, min(req.output_length, max_out)),
            }
            if per_request:  # the usage chunk, which a router may drop when the client did not ask for it
                call["stream_options"] = {"include_usage": True}
            body = orjson.dumps(call)
            got = await timed_stream(client, urls[i % len(urls)], body, headers, 600.0, keep=per_request)
            if got.error is not None:
                errors.append(got.error)
            elif got.ttft is not None:
                ttfts.append(got.ttft)
                if per_request:
                    answers.append((i, *answered(got), round(got.ttft, 4)))
        finally:
            bar.update()

    lag: list[float] = []
    probe = asyncio.ensure_future(watch_loop_lag(lag.append))
    try:
        with Progress(len(items), "arena replay", unit="requests", stream=None if progress else io.StringIO()) as bar:
            await asyncio.gather(*(one(i, r, p) for i, (r, p) in items))
        wall = time.perf_counter() - start
    finally:
        probe.cancel()
        await client.aclose()
    return {"ttfts": ttfts, "errors": errors, "wall_s": wall, "client_lag": lag, "per_request": sorted(answers)}


async def replay_sampled(
    url: str | Sequence[str],
    trace: Sequence[TraceRequest],
    prompts: Sequence[str],
    speed: float,
    max_out: int,
    replica_urls: list[str],
    proxy_url: str | None,
    interval: float = 1.0,
    clients: int = 1,
    per_request: bool = False,
) -> dict[str, Any]:
    """`replay` with `sample_queues` running beside it; adds "queues" (the samples)."""
    stop, samples = asyncio.Event(), []  # type: ignore[var-annotated]
    sampler = asyncio.ensure_future(sample_queues(replica_urls, proxy_url, interval, stop, samples))
    try:
        run = await replay(url, trace, prompts, speed, max_out, {"authorization": "Bearer arena"}, clients, per_request)
    finally:
        stop.set()
        await sampler
    run["queues"] = samples
    return run


def replica_stats(urls: list[str]) -> list[dict[str, Any]]:
    return [httpx.get(f"{u}/stats", params={"ttfts": "true"}, timeout=10).json() for u in urls]


def summarise(run: dict[str, Any], stats: list[dict[str, Any]]) -> dict[str, Any]:
    """One router's figures: hit rate and requests per replica from the replicas, TTFT from the client."""
    prompt = sum(s["prompt_tokens"] for s in stats)
    cached = sum(s["cached_tokens"] for s in stats)
    reqs = [s["requests"] for s in stats]
    t = run["ttfts"]
    engine_t = [x for s in stats for x in s.get("ttfts", [])]
    return {
        "hit_rate": cached / prompt if prompt else 0.0,
        "ttft_mean_s": statistics.fmean(t) if t else float("nan"),
        "ttft_p50_s": pct(t, 0.5),
        "ttft_p90_s": pct(t, 0.9),
        "ttft_p99_s": pct(t, 0.99),
        "imbalance": max(reqs) / statistics.fmean(reqs) if sum(reqs) else float("nan"),
        "errors": len(run["errors"]),
        "error_samples": run["errors"][:3],
        "requests_per_replica": reqs,
        "completed": len(t),
        "wall_s": run["wall_s"],
        "queued_check": queue_check(run.get("queues", [])),
        # the engines' own TTFT (arrival at the replica → first token): client TTFT minus this is the router's share
        "engine_ttft_p50_s": pct(engine_t, 0.5),
        "engine_ttft_p99_s": pct(engine_t, 0.99),
        "engine_ttft_mean_s": statistics.fmean(engine_t) if engine_t else float("nan"),
        "ttfts_s": sorted(
            round(x, 4) for x in t
        ),  # every request's client TTFT: the CDF of `kvgate bench plot routing`
        # the load generator's own event-loop lag (50 ms ticks): an upper bound on what it adds to a TTFT
        "client_lag_p99_s": pct(run.get("client_lag") or [0.0], 0.99),
        "client_lag_max_s": max(run.get("client_lag") or [0.0]),
        **({"per_request": run["per_request"]} if run.get("per_request") else {}),
    }
