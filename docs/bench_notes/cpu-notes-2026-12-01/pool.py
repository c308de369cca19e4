"""The three throughput sets pooled: per round, kvgate_router's CPU per request over
sglang-router's (the same run), for the session's start (base) and its end; geometric means with a
Student's t interval, and the end over the start paired by round."""

import json
import math
import statistics as st

SETS = [("throughput-1", 10, "new"), ("throughput-2", 8, "new2"), ("throughput-3", 6, "new2")]


def gm(xs):
    g = [math.log(x) for x in xs]
    m, s = st.mean(g), st.stdev(g)
    h = 2.069 * s / math.sqrt(len(g))  # t(0.975, 23)
    return f"{math.exp(m):.3f} (95% {math.exp(m - h):.3f}-{math.exp(m + h):.3f}, n={len(g)})"


cpu = {"base": [], "new": []}
rps = {"base": [], "new": []}
paired = []
for folder, rounds, tree in SETS:
    for i in range(1, rounds + 1):
        pair = {}
        for name, key in (("base", "base"), (tree, "new")):
            rows = {r["target"]: r for r in json.load(open(f"{folder}/{name}-{i}.json"))["rows"]}
            k, s = rows["kvgate_router"], rows["sglang_router"]
            cpu[key].append(k["proxy_cpu_ms_per_req"] / s["proxy_cpu_ms_per_req"])
            rps[key].append(k["rps"] / s["rps"])
            pair[key] = cpu[key][-1]
        paired.append(pair["new"] / pair["base"])
for key in cpu:
    at = sum(x <= 1.5 for x in cpu[key])
    print(
        key,
        "CPU/req vs sglang-router:",
        gm(cpu[key]),
        "| req/s vs sglang-router:",
        gm(rps[key]),
        "| rounds at or under 1.5x:",
        at,
    )
print("new/base, paired by round:", gm(paired))
