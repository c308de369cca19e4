"""`kvgate bench vllm-kv --routers`: `kvgate bench vllm`'s routing comparison rerun with kvgate's KV
connector on both engines over one shared disk tier (tools/bench/vllm_arena.py --kv-connector):
round_robin, sglang-router, vllm-router (each tuned on conversations disjoint from the reported
ones, as there) and kvgate cache_aware in precise mode, which learns the tiers from the engines'
events and weighs loads at their measured cost (reported as kvgate_tier_aware)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvgate.tools.bench.vllm_arena import add_arguments, run_bench

NAMES = {
    "round_robin": "round_robin",
    "sglang": "sglang",
    "vllm_router": "vllm_router",
    "kvgate_precise": "kvgate_tier_aware",
}
KEYS = (
    "ttft_mean_s",
    "ttft_mean_ci_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "cached_fraction",
    "external_fraction",
    "errors",
    "requests",
    "router",
    "params",
)


def routers_with_connector(work: Path, runs: int, extra: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--json",
            str(work / "routers.json"),
            "--arms",
            ",".join(NAMES),
            "--runs",
            str(runs),
            "--kv-connector",
            "--dir",
            str(work),
            *(extra or []),
        ]
    )
    result = run_bench(args)
    out: dict[str, Any] = {NAMES[arm]: {k: s.get(k) for k in KEYS} for arm, s in result["routers"].items()}
    out["_details"] = {
        "oracle_cached_fraction": result.get("oracle_cached_fraction"),
        "tuning": result.get("tuning"),
        "scaling": result.get("scaling"),
        "wall_s": result.get("wall_s"),
        "runs": {NAMES[a]: s["runs"] for a, s in result["routers"].items()},
    }
    return out
