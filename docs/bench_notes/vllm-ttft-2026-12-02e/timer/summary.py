"""CPU per relayed chunk (10 ms apart), old against new tree, alternated; sglang-router beside new."""
import json, statistics as st
rows = {}
for r in (1, 2, 3):
    for t in ("old", "new"):
        for q in (16, 136):
            for row in json.load(open(f"{t}-q{q}-{r}.json"))["rows"]:
                rows[(t, row["target"], q, r)] = row
def per(t, target, r):
    a, b = rows[(t, target, 16, r)], rows[(t, target, 136, r)]
    return (b["proxy_cpu_ms_per_req"] - a["proxy_cpu_ms_per_req"]) / 120 * 1000, a, b
out = {"old kvgate_router": [], "new kvgate_router": [], "sglang_router": []}
for r in (1, 2, 3):
    for label, t, target in (("old kvgate_router", "old", "kvgate_router"), ("new kvgate_router", "new", "kvgate_router"), ("sglang_router", "new", "sglang_router")):
        v, a, b = per(t, target, r)
        out[label].append(v)
        print(f"round {r} {label:18s} {v:5.2f} us per chunk; CPU per request 16 words {a['proxy_cpu_ms_per_req']:.3f} ms, 136 words {b['proxy_cpu_ms_per_req']:.3f} ms; errors {a['errors'] + b['errors']}")
for k, v in out.items():
    print(f"{k:18s} mean {st.mean(v):5.2f} us per chunk (rounds {', '.join(f'{x:.2f}' for x in v)})")
print("new / old, round by round:", ", ".join(f"{n / o:.3f}" for n, o in zip(out["new kvgate_router"], out["old kvgate_router"])))
print("new / sglang-router, round by round:", ", ".join(f"{n / s:.3f}" for n, s in zip(out["new kvgate_router"], out["sglang_router"])))
