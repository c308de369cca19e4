"""The goal cell's 12 rounds: per round kvgate_router's CPU per request and req/s over
sglang-router's in the same run, for base (bc8fd78) and new; geometric means with a Student's t
interval, and new over base paired by round."""

import json
import math
import statistics as st


def gm(xs):
    g = [math.log(x) for x in xs]
    m, s = st.mean(g), st.stdev(g)
    h = 2.201 * s / math.sqrt(len(g))  # t(0.975, 11)
    return f"{math.exp(m):.3f} (95% {math.exp(m - h):.3f}-{math.exp(m + h):.3f}, n={len(g)})"


cpu, rps, paired = {"base": [], "new": []}, {"base": [], "new": []}, []
for i in range(1, 13):
    cells = []
    for t in ("base", "new"):
        rows = {r["target"]: r for r in json.load(open(f"{t}-{i}.json"))["rows"]}
        k, s = rows["kvgate_router"], rows["sglang_router"]
        cpu[t].append(k["proxy_cpu_ms_per_req"] / s["proxy_cpu_ms_per_req"])
        rps[t].append(k["rps"] / s["rps"])
        cells.append(
            f"{t}: kvgate {k['proxy_cpu_ms_per_req']:.3f} ms, sglang {s['proxy_cpu_ms_per_req']:.3f} ms, "
            f"ratio {cpu[t][-1]:.3f}, req/s {k['rps']:.0f} / {s['rps']:.0f}, errors {k['errors']} / {s['errors']}"
        )
    paired.append(cpu["new"][-1] / cpu["base"][-1])
    print(i, " | ".join(cells))
for t in cpu:
    print(t, "CPU/req over sglang-router's:", gm(cpu[t]), "| req/s over sglang-router's:", gm(rps[t]))
print("new/base CPU ratio, paired by round:", gm(paired))
