"""Section `cache` of `kvgate bench scaleout`: the same traffic, one request at a time, sent
round-robin over 1 proxy on Redis, over N proxies on Redis, and over N proxies in `local` mode
with a cache dir each (the baseline: what N machines get without a shared store). Hit latency
(client-side, per tier, p50) through Redis vs local in the same run, from the N-proxy runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvgate.tools.bench.scaleout_cluster import Cluster, Outcome, send
from kvgate.tools.bench.scaleout_traffic import trace
from kvgate.tools.redis_proc import RedisServer

if TYPE_CHECKING:
    from kvgate.tools.bench.scaleout import Context


def run_arm(ctx: Context, n: int, redis: bool, tag: str) -> Outcome:
    asks = trace(ctx.pairs, ctx.args.requests, ctx.args.seed)
    server = RedisServer().start() if redis else None
    cluster = Cluster(n, ctx.work, ctx.api_base, server.url if server else None, tag)
    try:
        return send(cluster.urls, asks, ctx.pairs)
    finally:
        cluster.stop()
        if server is not None:
            server.stop()


def run(ctx: Context) -> dict[str, Any]:
    n = ctx.args.proxies
    one = run_arm(ctx, 1, True, "one")
    shared = run_arm(ctx, n, True, "redis")
    local = run_arm(ctx, n, False, "local")
    arms = {"one_redis": one, "n_redis": shared, "n_local": local}
    return {
        "hit_rate_1": one.hit_rate(),
        "hit_rate_n_redis": shared.hit_rate(),
        "hit_rate_n_local": local.hit_rate(),
        "exact_p50_ms_local": local.p50_ms("exact"),
        "exact_p50_ms_redis": shared.p50_ms("exact"),
        "semantic_p50_ms_local": local.p50_ms("semantic"),
        "semantic_p50_ms_redis": shared.p50_ms("semantic"),
        "miss_p50_ms_local": local.p50_ms("miss"),
        "miss_p50_ms_redis": shared.p50_ms("miss"),
        "tiers": {
            name: {t: o.tiers.count(t) for t in ("miss", "exact", "semantic", "error")} for name, o in arms.items()
        },
        "wrong_answers": {name: o.wrong for name, o in arms.items()},
    }
