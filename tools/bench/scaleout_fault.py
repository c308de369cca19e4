"""Section `fault` of `kvgate bench scaleout`: N proxies on one Redis take the traffic one request
at a time; Redis is SIGKILLed at 25 % of the run and started again, empty, at 50 %. Every answer
is checked (kvgate.tools.bench.scaleout_traffic.right_answer). Reported: requests, client errors and
wrong answers (goal 0 and 0), and the hit rate per 10 % of the run (it falls to 0 while Redis is
down and climbs back as the cache refills).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvgate.tools.bench.scaleout_cluster import Cluster, send
from kvgate.tools.bench.scaleout_traffic import trace
from kvgate.tools.redis_proc import RedisServer

if TYPE_CHECKING:
    from kvgate.tools.bench.scaleout import Context


def run(ctx: Context) -> dict[str, Any]:
    n, total = ctx.args.proxies, ctx.args.requests
    asks = trace(ctx.pairs, total, ctx.args.seed + 1)
    server = RedisServer().start()
    cluster = Cluster(n, ctx.work, ctx.api_base, server.url, "fault")
    kill_at, restart_at = total // 4, total // 2

    def fault(i: int) -> None:
        if i == kill_at and server.proc is not None:
            server.proc.kill()  # SIGKILL: no goodbye to the clients
            server.proc.wait()
        elif i == restart_at:
            server.restart()  # no persistence: it comes back empty

    try:
        out = send(cluster.urls, asks, ctx.pairs, on_progress=fault)
    finally:
        cluster.stop()
        server.stop()
    tenth = max(1, total // 10)
    return {
        "requests": total,
        "errors": out.tiers.count("error"),
        "wrong_answers": out.wrong,
        "killed_at": kill_at,
        "restarted_at": restart_at,
        "hit_rate_per_10pct": [out.hit_rate(lo, lo + tenth) for lo in range(0, total, tenth)],
    }
