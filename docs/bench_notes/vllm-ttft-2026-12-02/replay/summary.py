"""kvgate precise, its own placements replayed with no router (replay_precise) and sglang-router,
same runs: each arm's mean TTFT over first and later turns, the run-by-run ratios with a Student's
t interval (kvgate.tools.bench.vllm_arena_stats.paired_ratio), and per turn kvgate precise's TTFT
minus the replay's for the same conversation and turn in the same run. Usage: python summary.py vllm.json"""

import json
import statistics as st
import sys
from pathlib import Path

from kvgate.tools.bench.vllm_arena_stats import paired_ratio

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "vllm-ttft-2026-12-01c"))
from pool import turn_means  # noqa: E402

ARMS = ("kvgate_precise", "replay_precise", "sglang")


def means(run, later):
    """The run's mean TTFT over its first turns, or over its later ones."""
    return turn_means(run)[1 if later else 0]


def turns(run):
    return {(r["c"], r["t"]): r["ttft_s"] for r in run["request_records"] if r.get("ttft_s") is not None}


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


routers = json.load(open(sys.argv[1]))["routers"]
runs = {arm: routers[arm]["runs"] for arm in ARMS}
for arm in ARMS:
    a = routers[arm]
    first = [means(r, False) for r in runs[arm]]
    later = [means(r, True) for r in runs[arm]]
    print(
        f"{arm:16s} {a['ttft_mean_s'] * 1e3:.0f} ± {a['ttft_mean_ci_s'] * 1e3:.0f} ms; first turns {st.mean(first):.3f} s, "
        f"later {st.mean(later):.3f} s; cached {a['cached_fraction']:.3f}; errors {a['errors']} / {a['requests']}; "
        f"router CPU {a['router_cpu_ms_per_request']} ms/request"
    )
for a, b in (("kvgate_precise", "sglang"), ("replay_precise", "sglang"), ("kvgate_precise", "replay_precise")):
    whole = paired_ratio([r["ttft_mean_s"] for r in runs[a]], [r["ttft_mean_s"] for r in runs[b]])
    first = paired_ratio([means(r, False) for r in runs[a]], [means(r, False) for r in runs[b]])
    later = paired_ratio([means(r, True) for r in runs[a]], [means(r, True) for r in runs[b]])
    print(f"{a}/{b}: {whole}; first turns {first}; later turns {later}")
for later in (False, True):
    diffs = []
    for k, r in zip(runs["kvgate_precise"], runs["replay_precise"]):
        mine, replayed = turns(k), turns(r)
        diffs += [(mine[key] - replayed[key]) * 1e3 for key in mine if key in replayed and (key[1] > 0) == later]
    print(
        f"{'later' if later else 'first'} turns, kvgate precise minus the replay, per turn (ms): median "
        f"{st.median(diffs):.0f}, mean {st.mean(diffs):.0f}, p10 {quantile(diffs, 0.1):.0f}, p90 {quantile(diffs, 0.9):.0f}, n {len(diffs)}"
    )
