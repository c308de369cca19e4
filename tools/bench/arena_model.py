"""`kvgate bench routing-model`: the routing arena in virtual time — no processes, no clock, the
same answer every run — for comparing routing rules on a trace in seconds.

The model is the arena's fifo replica (kvgate.engines.sim.engine) reduced to arithmetic: per replica an
LRU PrefixCache and one FIFO prefill queue; a request routed at its arrival starts its prefill
when the replica's previous one ends, hits what the cache holds then, and takes overhead +
uncached / prefill_tps; decode ends completion / decode_tps later. The router's view is the one
kvgate's Router keeps: a PrefixIndex fed in approximate mode (unbounded), in-flight counts, and
pending prefill tokens that drop at each first token. There is no proxy, network or CPU in it:
it measures routing decisions only (the live arena measures everything).

Because a replica prefills strictly in arrival order, a request's hit and start time are known
the moment it is routed (every request ahead of it on that replica was routed before), so one
pass over the trace suffices. The anchors are represented by `SglangRule` and `VllmRule`, their
cache_aware decisions over the same block hashes (no tree eviction).

kvgate's cache_aware defaults (middleware/routing/cache_aware.py) were chosen with this model on
requests 0–800 of the conversation trace and of `kvgate bench gen-trace`'s long-prompt trace.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from kvgate.engines.sim.base import matchable
from kvgate.engines.sim.engine import DEFAULT_OVERHEAD_S, PrefixCache, SimEngine
from kvgate.index.kv.prefix import PrefixIndex
from kvgate.middleware.routing import RoutingPolicy, make_policy
from kvgate.middleware.routing.base import ReplicaState, RoutePlan
from kvgate.tools.bench.stats import pct, write_json
from kvgate.tools.bench.trace import load_trace, prompt_text

BLOCK = 16


@dataclass(frozen=True)
class ModelRequest:
    arrival_s: float  # trace time, seconds from the slice's first request
    prompt_tokens: int
    hashes: tuple[int, ...]
    completion_tokens: int


def prepare(path: Path, lo: int, hi: int, block_tokens: int = 512, max_out: int = 256) -> list[ModelRequest]:
    """Requests [lo, hi) of a Mooncake trace as the arena sends them (text prompts, block hashes)."""
    trace = load_trace(path, hi)[lo:hi]
    engine = SimEngine(1, BLOCK, prefill_tps=1, decode_tps=1)
    out = []
    for r in trace:
        req = engine.request([{"role": "user", "content": prompt_text(r, block_tokens)}])
        out.append(
            ModelRequest(
                (r.timestamp_ms - trace[0].timestamp_ms) / 1000,
                req.prompt_tokens,
                tuple(req.hashes),
                max(1, min(r.output_length, max_out)),
            )
        )
    return out


class SglangRule:
    """sglang-router's cache_aware choice: the least-loaded worker (requests in flight) when
    loads are imbalanced beyond both thresholds; else the longest prefix match if it covers more
    than cache_threshold of the prompt; else the worker whose tree is smallest (vllm-router's
    rule, `VllmRule`, takes the least-loaded worker there instead)."""

    name = "sglang"
    low_match = "smallest_tree"

    def __init__(
        self, cache_threshold: float = 0.3, balance_abs_threshold: int = 64, balance_rel_threshold: float = 1.5
    ):
        self.ct, self.abs, self.rel = cache_threshold, balance_abs_threshold, balance_rel_threshold
        self._tree: dict[str, int] = {}

    def choose(self, candidates: Sequence[ReplicaState], plan: RoutePlan) -> ReplicaState:
        loads = [r.in_flight for r in candidates]
        if max(loads) - min(loads) > self.abs and max(loads) > self.rel * min(loads):
            return min(candidates, key=lambda r: r.in_flight)
        best = max(candidates, key=lambda r: plan.matched_blocks.get(r.name, 0))
        if plan.prompt_tokens and plan.matched_tokens(best.name) / plan.prompt_tokens > self.ct:
            pick = best
        elif self.low_match == "least_loaded":
            pick = min(candidates, key=lambda r: r.in_flight)
        else:
            pick = min(candidates, key=lambda r: self._tree.get(r.name, 0))
        self._tree[pick.name] = self._tree.get(pick.name, 0) + plan.prompt_tokens - plan.matched_tokens(pick.name)
        return pick


class VllmRule(SglangRule):
    """vllm-router's cache_aware choice: sglang's, but a low match goes to the least-loaded worker."""

    name = "vllm_router"
    low_match = "least_loaded"


def simulate(
    requests: Sequence[ModelRequest],
    policy: RoutingPolicy | SglangRule,
    *,
    replicas: int = 4,
    capacity_tokens: int = 1_500_000,
    prefill_tps: float = 48_000,
    decode_tps: float = 240,
    speed: float = 4.0,
) -> dict[str, float]:
    """Route and serve every request; hit rate (cached / prompt tokens), TTFT p50/p99/mean (s,
    trace time ÷ speed), imbalance (max/mean requests). Deterministic."""
    caches = [PrefixCache(capacity_tokens // BLOCK) for _ in range(replicas)]
    busy_until = [0.0] * replicas
    states = [ReplicaState(f"r{i}", "") for i in range(replicas)]
    index = PrefixIndex(None)
    for s in states:
        index.add_replica(s.name)
    events: list[tuple[float, int, int, int, int]] = []  # (time, seq, kind 0 first token / 1 end, replica, tokens)
    seq = itertools.count()
    ttfts: list[float] = []
    cached = prompt = 0
    counts = [0] * replicas
    resident = bool(getattr(policy, "reads_resident", False))
    for req in requests:
        now = req.arrival_s / speed
        while events and events[0][0] <= now:
            _, _, kind, i, tokens = heapq.heappop(events)
            if kind == 0:
                states[i].pending_prefill_tokens -= tokens
            else:
                states[i].in_flight -= 1
        matched = index.match(req.hashes)
        plan = RoutePlan(
            list(req.hashes), req.prompt_tokens, BLOCK, matched, shared_prefix=index.shared_match(req.hashes, matched)
        )  # as Router.plan
        if resident:  # as Router.refresh_load
            for s in states:
                s.resident_tokens = index.blocks(s.name) * BLOCK + s.pending_prefill_tokens
        i = int(policy.choose(states, plan).name[1:])
        pending = max(0, req.prompt_tokens - plan.matched_tokens(f"r{i}"))
        states[i].pending_prefill_tokens += pending
        states[i].in_flight += 1
        counts[i] += 1
        index.record(f"r{i}", req.hashes)
        start = max(now, busy_until[i])
        hit = caches[i].match(matchable(req.hashes, req.prompt_tokens, BLOCK)) * BLOCK
        caches[i].insert(req.hashes)
        first = start + DEFAULT_OVERHEAD_S + (req.prompt_tokens - hit) / prefill_tps
        busy_until[i] = first
        ttfts.append(first - now)
        cached, prompt = cached + hit, prompt + req.prompt_tokens
        heapq.heappush(events, (first, next(seq), 0, i, pending))
        heapq.heappush(events, (first + req.completion_tokens / decode_tps, next(seq), 1, i, 0))
    return {
        "hit_rate": cached / prompt if prompt else 0.0,
        "ttft_p50_s": pct(ttfts, 0.5),
        "ttft_p99_s": pct(ttfts, 0.99),
        "ttft_mean_s": statistics.fmean(ttfts),
        "imbalance": max(counts) / statistics.fmean(counts),
    }


def parse_candidates(text: str) -> list[dict[str, Any]]:
    """'k=v,k=v;k=v' → [{k: v, k: v}, {k: v}] (values as YAML: .inf, 2.5, ...); '' → [{}]."""
    out = [
        {k.strip(): yaml.safe_load(v) for k, _, v in (kv.partition("=") for kv in c.split(",") if kv.strip())}
        for c in text.split(";")
        if c.strip()
    ]
    return out or [{}]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", type=Path, action="append", required=True, help="Mooncake trace (repeatable)")
    p.add_argument("--slices", default="0:400,400:800", help="comma list of A:B request slices, each run separately")
    p.add_argument(
        "--candidates",
        default="",
        metavar="K=V,...;...",
        help="cache_aware option sets to compare (default: its defaults only), e.g. 'miss_weight=8;queue_slack=.inf'",
    )
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--capacity-tokens", type=int, default=1_500_000)
    p.add_argument("--json", type=Path, default=None)


def main(args: argparse.Namespace) -> int:
    slices = [tuple(int(x) for x in s.split(":")) for s in args.slices.split(",") if s]
    data = {f"{t.stem}[{lo}:{hi}]": prepare(t, lo, hi) for t in args.trace for lo, hi in slices}
    result: dict[str, Any] = {"sets": list(data), "rows": []}
    rules: list[tuple[str, Any]] = [("sglang", SglangRule), ("vllm_router", VllmRule)] + [
        (f"cache_aware {c}" if c else "cache_aware (defaults)", lambda c=c: make_policy("cache_aware", **c))
        for c in parse_candidates(args.candidates)
    ]
    for label, factory in rules:
        figures = {
            name: simulate(reqs, factory(), replicas=args.replicas, capacity_tokens=args.capacity_tokens)
            for name, reqs in data.items()
        }
        result["rows"].append({"rule": label, "figures": figures})
        print(f"{label:48s} " + "  ".join(f"{f['hit_rate']:.3f}/{f['ttft_p99_s']:.2f}s" for f in figures.values()))
    print("(hit rate / TTFT p99 per set: " + ", ".join(data) + ")", file=sys.stderr)
    write_json(args.json, result)
    return 0
