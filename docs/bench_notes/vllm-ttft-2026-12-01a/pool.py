"""Approximate mode against sglang-router, pooled over sets: the geometric mean of the run-by-run
TTFT ratios with a Student's t interval (kvgate.tools.bench.vllm_arena_stats.paired_ratio), and
the same over first and later turns from each run's request records."""
import json, sys
from kvgate.tools.bench.vllm_arena_stats import paired_ratio

def runs(path):
    d = json.load(open(path))
    return d["routers"]["kvgate_approximate"]["runs"], d["routers"]["sglang"]["runs"]

def turn_means(run):
    first, later = [], []
    for rec in run["request_records"]:
        t = rec.get("ttft_s")
        if t is None:
            continue
        (first if rec.get("t", 0) == 0 else later).append(t)
    return (sum(first) / len(first) if first else None, sum(later) / len(later) if later else None)

sets = sys.argv[1:]
a_all, s_all, af, sf, al, sl = [], [], [], [], [], []
for path in sets:
    a, s = runs(path)
    print(path, "runs", len(a), "set ratio", paired_ratio([r["ttft_mean_s"] for r in a], [r["ttft_mean_s"] for r in s]))
    a_all += [r["ttft_mean_s"] for r in a]; s_all += [r["ttft_mean_s"] for r in s]
    for ra, rs in zip(a, s):
        (fa, la), (fs, ls) = turn_means(ra), turn_means(rs)
        if None not in (fa, fs): af.append(fa); sf.append(fs)
        if None not in (la, ls): al.append(la); sl.append(ls)
print("pooled", len(a_all), "runs:", paired_ratio(a_all, s_all))
print("first turns:", paired_ratio(af, sf))
print("later turns:", paired_ratio(al, sl))
