"""Section `routing` of `kvgate bench scaleout`: the routing arena through N proxies.

The same slice of a trace (`--routing-trace`, first `--routing-limit` requests, at
`--routing-speed`× its timestamps) is replayed three times against the same simulated replicas
(the arena's: `kvgate sim-replica`, fifo model; caches reset before each run), through kvgate
`cache_aware` in approximate mode:

1. one proxy routing alone (`hit_rate_1`, the anchor: one process sees every decision);
2. N proxies on one Redis (`store.backend: redis`: load and routing decisions shared through
   middleware/routing/state_redis.py) — `hit_rate_n_redis`;
3. N proxies each with its own state (`store.backend: local`, a cache dir each) — the
   per-proxy baseline, `hit_rate_n_local`.

With N proxies the client sends request i to proxy i mod N, so a conversation's turns land on
different proxies, as behind a load balancer. Hit rate is the replicas' own cached / prompt
tokens. Every setup runs the same kvgate defaults: nothing is tuned here (no tuning slice).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kvgate.tools.bench.arena import Arena, warm_up
from kvgate.tools.bench.arena_replay import replay_sampled, replica_stats, summarise
from kvgate.tools.bench.arena_routers import kvgate_config
from kvgate.tools.bench.procs import Proc, free_port, kvgate_argv
from kvgate.tools.bench.trace import load_trace
from kvgate.tools.redis_proc import RedisServer

if TYPE_CHECKING:
    from kvgate.tools.bench.scaleout import Context

log = logging.getLogger("kvgate.bench.scaleout")
GOAL = 0.95  # scale-out goal: N proxies on Redis reach >= 0.95x the hit rate of one proxy
REPLICAS = 4
CAPACITY_TOKENS = 1_500_000  # per replica: the routing arena's setting, so the two benches compare
MAX_OUTPUT_TOKENS = 256
BLOCK_TOKENS = 512


def _arena_args(speed: float) -> argparse.Namespace:
    """The routing arena's settings for its replicas (its defaults, at our speed)."""
    return argparse.Namespace(
        block_tokens=BLOCK_TOKENS,
        prefill_tps=None,
        decode_tps=None,
        speed=speed,
        routing=[],
        replicas=REPLICAS,
        capacity_tokens=CAPACITY_TOKENS,
        sim_model="fifo",
        step_tokens=2048,
        capacity_hint="none",
        max_output_tokens=MAX_OUTPUT_TOKENS,
    )


def proxy_config(arena: Arena, cache_dir: Path, redis: tuple[str, str] | None, sync_s: float) -> dict[str, Any]:
    """One proxy's config: the arena's kvgate cache_aware setup; `redis` = (url, key prefix) shares
    its store (and so its routing view) with every proxy given the same pair."""
    cfg = kvgate_config("cache_aware", arena.urls, str(cache_dir), arena.events, arena.capacity_blocks)
    if redis is not None:
        cfg["store"] = {"backend": "redis", "url": redis[0], "key_prefix": redis[1], "routing": {"sync_s": sync_s}}
    return cfg


def run_setup(
    arena: Arena, work: Path, name: str, proxies: int, redis_url: str | None, sync_s: float
) -> dict[str, Any]:
    """`proxies` kvgate processes (own cache dir each), the slice replayed over them, summarised."""
    redis = (redis_url, f"bench-{name}:") if redis_url is not None else None  # fresh keys per setup
    procs, urls = [], []
    for i in range(proxies):
        port, path = free_port(), work / f"kvgate-{name}-{i}.yaml"
        path.write_text(yaml.safe_dump(proxy_config(arena, work / f"cache-{name}-{i}", redis, sync_s)))
        procs.append(
            Proc(
                f"proxy-{name}-{i}",
                kvgate_argv("serve", "--config", str(path), "--port", str(port), "--log-level", "warning"),
                work,
            )
        )
        urls.append(f"http://127.0.0.1:{port}")
    try:
        for proc, url in zip(procs, urls):
            proc.wait_http(f"{url}/health")
        for url in urls:
            warm_up(f"{url}/v1/chat/completions", arena.urls)  # and resets the replicas: each setup starts cold
        run = asyncio.run(
            replay_sampled(
                [f"{u}/v1/chat/completions" for u in urls],
                arena.trace,
                arena.prompts,
                arena.args.speed,
                MAX_OUTPUT_TOKENS,
                arena.urls,
                None,
            )
        )
    finally:
        for proc in procs:
            proc.stop()
    summary = summarise(run, replica_stats(arena.urls))
    summary.update(setup=name, proxies=proxies)
    return summary


def run(ctx: Context) -> dict[str, Any]:
    """The section: the three setups on the same replicas and requests."""
    a = ctx.args
    if not a.routing_trace.is_file():
        raise SystemExit(
            f"kvgate bench scaleout: --routing-trace {a.routing_trace} does not exist "
            "(a Mooncake-format JSONL trace; `kvgate bench gen-trace` writes one)"
        )
    return run_routing(a.routing_trace, a.routing_limit, a.routing_speed, a.proxies, ctx.work / "routing")


def run_routing(
    trace_path: Path, limit: int, speed: float, proxies: int, work: Path, sync_s: float = 0.1
) -> dict[str, Any]:
    """1 proxy, `proxies` on one Redis, `proxies` alone: hit rates, their ratios and each run's summary."""
    work.mkdir(parents=True, exist_ok=True)
    trace = load_trace(trace_path, limit)
    arena = Arena(_arena_args(speed), trace, work)
    runs: dict[str, dict[str, Any]] = {}
    with RedisServer() as redis_server:
        try:
            arena.start()
            for name, n, url in (("one", 1, None), ("n_redis", proxies, redis_server.url), ("n_local", proxies, None)):
                runs[name] = s = run_setup(arena, work, name, n, url, sync_s)
                log.warning(
                    "scaleout routing: %s (%d proxies): hit %.3f, ttft p50 %.0f ms, p99 %.0f ms, errors %d",
                    name,
                    n,
                    s["hit_rate"],
                    s["ttft_p50_s"] * 1000,
                    s["ttft_p99_s"] * 1000,
                    s["errors"],
                )
        finally:
            arena.stop()
    one, shared, alone = (runs[k]["hit_rate"] for k in ("one", "n_redis", "n_local"))
    return {
        "hit_rate_1": one,
        "hit_rate_n_redis": shared,
        "hit_rate_n_local": alone,
        "redis_over_1": shared / one if one else None,
        "local_over_1": alone / one if one else None,
        "goal_redis_over_1": GOAL,
        "trace": str(trace_path),
        "requests": len(trace),
        "speed": speed,
        "replicas": REPLICAS,
        "capacity_tokens": CAPACITY_TOKENS,
        "sync_s": sync_s,
        "runs": {
            k: {
                f: v.get(f)
                for f in (
                    "hit_rate",
                    "ttft_p50_s",
                    "ttft_p99_s",
                    "imbalance",
                    "errors",
                    "error_samples",
                    "requests_per_replica",
                    "completed",
                    "wall_s",
                )
            }
            for k, v in runs.items()
        },
        "logs": str(work),
    }
