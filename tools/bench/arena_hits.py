"""`kvgate bench routing-hits`: where each router's prefix hits went in a `kvgate bench routing
--per-request` result.

Every request's replica and cached tokens come from the sim replicas' own answers. Replaying
those choices, in arrival order, through one LRU per replica (the sim's own PrefixCache, same
capacity) rebuilds what each replica held when each request arrived; `reconstructed` says how
closely that matches the hit rate the replicas reported (it is exact when each replica admitted
its requests in arrival order). From the rebuild, per router:

- `routed_away`: tokens a request could have had on another replica that held a longer prefix
  of it (the router's choice cost them);
- `held_nowhere`: tokens one LRU of the total capacity (the `ceiling_lru` model) would have had
  but no replica held (the split of the cache between replicas cost them);
- and, against cache_aware, the requests on which each anchor got more or fewer cached tokens.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from kvgate.engines.sim.base import matchable
from kvgate.engines.sim.engine import PrefixCache
from kvgate.tools.bench.arena_model import BLOCK, prepare
from kvgate.tools.bench.arena_replay import pooled_hits
from kvgate.tools.bench.arena_table import load_result
from kvgate.tools.bench.stats import write_json


@dataclass(frozen=True)
class Row:
    """One answered request: its index in the slice, the replica that served it, its cached tokens."""

    index: int
    replica: str
    cached: int


def split(requests: Sequence[Any], rows: Sequence[Row], capacity_blocks: int, pooled: Sequence[int]) -> dict[str, Any]:
    """One router's rows replayed through per-replica LRUs in arrival order.

    Invariant: for each request, here ≤ best (best is the longest prefix any replica held), so
    routed_away ≥ 0; held_nowhere counts only requests where the pooled LRU had more than best."""
    caches: dict[str, PrefixCache] = defaultdict(lambda: PrefixCache(capacity_blocks))
    reported = rebuilt = away = nowhere = away_n = nowhere_n = 0
    for row in sorted(rows, key=lambda x: x.index):
        r = requests[row.index]
        m = matchable(r.hashes, r.prompt_tokens, BLOCK)
        best = max((c.match(m) for c in caches.values()), default=0) * BLOCK
        here = caches[row.replica].match(m) * BLOCK
        caches[row.replica].insert(list(r.hashes))
        reported, rebuilt = reported + row.cached, rebuilt + here
        if best > here:
            away, away_n = away + best - here, away_n + 1
        if pooled[row.index] > best:
            nowhere, nowhere_n = nowhere + pooled[row.index] - best, nowhere_n + 1
    total = sum(requests[row.index].prompt_tokens for row in rows) or 1
    return {
        "requests": len(rows),
        "hit_rate": reported / total,
        "reconstructed_hit_rate": rebuilt / total,
        "routed_away": away / total,
        "routed_away_requests": away_n,
        "held_nowhere": nowhere / total,
        "held_nowhere_requests": nowhere_n,
    }


def flips(ours: Sequence[Row], theirs: Sequence[Row], total_tokens: int) -> dict[str, Any]:
    """Requests on which `theirs` got more (`theirs_more`) or fewer cached tokens than `ours`, as
    counts and as shares of the slice's prompt tokens (their difference is the hit-rate gap)."""
    mine = {r.index: r.cached for r in ours}
    more = [(r.cached - mine[r.index]) for r in theirs if r.index in mine and r.cached > mine[r.index]]
    fewer = [(mine[r.index] - r.cached) for r in theirs if r.index in mine and r.cached < mine[r.index]]
    t = total_tokens or 1
    return {
        "theirs_more_requests": len(more),
        "theirs_more": sum(more) / t,
        "theirs_largest": max(more, default=0),
        "theirs_fewer_requests": len(fewer),
        "theirs_fewer": sum(fewer) / t,
    }


def analyse(result: dict[str, Any], trace: Path | None = None) -> dict[str, Any]:
    """The split for every router of one arena result that has per-request rows."""
    lo, hi = (int(x) for x in result["report_slice"].split(":"))
    requests = prepare(trace or Path(result["trace"]), lo, hi, result.get("block_tokens", 512))
    capacity_blocks = result["capacity_tokens"] // BLOCK
    pooled = pooled_hits(requests, capacity_blocks * result["replicas"])
    rows = {
        name: [Row(i, rep, int(c)) for i, rep, c, _ in p["per_request"] if rep is not None and c is not None]
        for name, p in result["policies"].items()
        if p.get("per_request")
    }
    if not rows:
        raise SystemExit("kvgate bench routing-hits: no per-request rows (run `kvgate bench routing --per-request`)")
    total = sum(r.prompt_tokens for r in requests)
    out: dict[str, Any] = {
        "scenario": result.get("scenario"),
        "report_slice": result["report_slice"],
        "ceiling_lru": sum(pooled) / total,
        "routers": {n: split(requests, r, capacity_blocks, pooled) for n, r in rows.items()},
    }
    if "cache_aware" in rows:
        out["vs_cache_aware"] = {n: flips(rows["cache_aware"], r, total) for n, r in rows.items() if n != "cache_aware"}
    return out


def table(a: dict[str, Any]) -> str:
    lines = [
        f"{a['scenario']} (slice {a['report_slice']}, ceiling_lru {a['ceiling_lru']:.4f})",
        "| router | hit rate (reported / rebuilt) | routed away (requests) | held nowhere (requests) | vs cache_aware: more on / fewer on |",
        "|---|---|---|---|---|",
    ]
    for name, s in a["routers"].items():
        f = a.get("vs_cache_aware", {}).get(name)
        vs = (
            f"{f['theirs_more_requests']} (+{f['theirs_more']:.4f}) / {f['theirs_fewer_requests']} (−{f['theirs_fewer']:.4f})"
            if f
            else "–"
        )
        lines.append(
            f"| {name} | {s['hit_rate']:.4f} / {s['reconstructed_hit_rate']:.4f} | {s['routed_away']:.4f} "
            f"({s['routed_away_requests']}) | {s['held_nowhere']:.4f} ({s['held_nowhere_requests']}) | {vs} |"
        )
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", type=Path, nargs="+", help="JSON of `kvgate bench routing --per-request`")
    p.add_argument("--trace", type=Path, default=None, help="the trace, when it is no longer where the result says")
    p.add_argument("--json", type=Path, default=None)


def main(args: argparse.Namespace) -> int:
    out = []
    for path in args.results:
        a = analyse(load_result(path, "kvgate bench routing-hits"), args.trace)
        print(table(a) + "\n")
        out.append({"file": str(path), **a})
    if args.json:
        write_json(args.json, {"results": out})
    return 0
