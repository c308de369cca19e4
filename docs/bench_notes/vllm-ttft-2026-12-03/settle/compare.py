"""The settle A/B: per set, kvgate approximate's wire figures and Server-Timing steps by first and
later turns, beside sglang-router's wire figures; then A and B pooled.
Usage: python compare.py (from this folder, after run.sh)."""
import json
import math
import statistics as st

STEPS = ("hop", "prefix", "route")


def steps(runs, first):
    recs = [r["proxy_ms"] for run in runs for r in run["request_records"] if "proxy_ms" in r and (r["t"] == 0) == first]
    return {k: (st.fmean(s[k] for s in recs), st.median(s[k] for s in recs)) for k in STEPS}, len(recs)


pooled = {"A": [], "B": []}
for name in ("A1", "B1", "A2", "B2"):
    try:
        d = json.load(open(f"{name}.json"))
    except FileNotFoundError:
        continue
    k, s = d["routers"]["kvgate_approximate"], d["routers"]["sglang"]
    pooled[name[0]].append(d)
    ratio = math.exp(st.fmean(math.log(a["ttft_mean_s"] / b["ttft_mean_s"]) for a, b in zip(k["runs"], s["runs"])))
    print(f"{name}: kvgate approximate / sglang-router TTFT {ratio:.3f}; wire before the engine {k['wire_pre_mean_ms']:.2f} ms "
          f"(sglang-router {s['wire_pre_mean_ms']:.2f}), p50 by run {[r['wire_pre_p50_ms'] for r in k['runs']]}; "
          f"first token's relay {k['wire_post_mean_ms']:.2f} (sglang-router {s['wire_post_mean_ms']:.2f})")
    for first in (True, False):
        got, n = steps(k["runs"], first)
        print(f"    {'first' if first else 'later'} turns ({n}): " + "  ".join(f"{key} {m:.2f}/{p:.2f}" for key, (m, p) in got.items()))
for tree, sets in pooled.items():
    if not sets:
        continue
    runs = [r for d in sets for r in d["routers"]["kvgate_approximate"]["runs"]]
    n = sum(r["wire_requests"] for r in runs)
    pre = sum(r["wire_pre_mean_ms"] * r["wire_requests"] for r in runs) / n
    post = sum(r["wire_post_mean_ms"] * r["wire_requests"] for r in runs) / n
    print(f"{tree} pooled ({len(runs)} runs, {n} requests): before the engine {pre:.2f} ms, first token's relay {post:.2f} ms")
    for first in (True, False):
        got, m = steps(runs, first)
        print(f"    {'first' if first else 'later'} turns ({m}): " + "  ".join(f"{key} {a:.2f}/{b:.2f}" for key, (a, b) in got.items()))
