"""The session's A/B: start (3b69a66) against end (f772b12), alternated, the order swapped each round.
Geometric means with a Student's t interval; end over start paired by round."""

import glob
import json
import math
import statistics as st
import sys

T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228, 11: 2.201}


def gm(xs):
    g = [math.log(x) for x in xs]
    if len(g) < 2:
        return f"{math.exp(g[0]):.3f} (n=1)"
    m, s = st.mean(g), st.stdev(g)
    h = T975[len(g) - 1] * s / math.sqrt(len(g))
    return f"{math.exp(m):.3f} (95% {math.exp(m - h):.3f}-{math.exp(m + h):.3f}, n={len(g)})"


def rounds(folder):
    n = len(glob.glob(f"{folder}/start-*.json"))
    return [i for i in range(1, n + 1) if glob.glob(f"{folder}/end-{i}.json")]


def in_process(folder, label):
    print(f"== in process, {label} target: CPU ms per request (pipeline_cpu --requests 6000)")
    per, paired = {"start": [], "end": []}, []
    for i in rounds(folder):
        row = {t: json.load(open(f"{folder}/{t}-{i}.json")) for t in per}
        for t in per:
            per[t].append(row[t]["cpu_ms_per_request"])
        paired.append(per["end"][-1] / per["start"][-1])
        print(f"  round {i}: start {per['start'][-1]:.4f}, end {per['end'][-1]:.4f}, errors {row['start']['errors']}/{row['end']['errors']}")
    for t in per:
        print(f"  {t}: {gm(per[t])} ms")
    print(f"  end/start, paired: {gm(paired)}")


def throughput(folder):
    print("== goal cell: all_miss, C=32; each kvgate target over sglang-router in the same run")
    for target in ("kvgate_relay", "kvgate_router"):
        cpu, rps, paired = {"start": [], "end": []}, {"start": [], "end": []}, []
        print(f" -- {target}")
        for i in rounds(folder):
            cells = []
            for t in cpu:
                rows = {r["target"]: r for r in json.load(open(f"{folder}/{t}-{i}.json"))["rows"]}
                k, s = rows[target], rows["sglang_router"]
                cpu[t].append(k["proxy_cpu_ms_per_req"] / s["proxy_cpu_ms_per_req"])
                rps[t].append(k["rps"] / s["rps"])
                cells.append(
                    f"{t}: {k['proxy_cpu_ms_per_req']:.3f}/{s['proxy_cpu_ms_per_req']:.3f} ms = {cpu[t][-1]:.3f}, "
                    f"req/s {k['rps']:.0f}/{s['rps']:.0f}, err {k['errors']}/{s['errors']}"
                )
            paired.append(cpu["end"][-1] / cpu["start"][-1])
            print(f"  round {i}: " + " | ".join(cells))
        for t in cpu:
            print(f"  {t}: CPU/req over sglang-router's {gm(cpu[t])}; req/s over sglang-router's {gm(rps[t])}")
        print(f"  end/start CPU ratio, paired by round: {gm(paired)}")


def each_row(folder, key):
    """(round, tree, row) for every row under `key` of every run, round by round, start first."""
    for i in rounds(folder):
        for t in ("start", "end"):
            for r in json.load(open(f"{folder}/{t}-{i}.json"))[key]:
                yield i, t, r


def hit_heavy(folder):
    print("== hit-heavy relay: req/s and CPU ms per request")
    for i, t, r in each_row(folder, "rows"):
        print(
            f"  round {i} {t}: C={r['concurrency']} req/s {r['rps']:.0f}, CPU {r['proxy_cpu_ms_per_req']:.3f} ms, "
            f"p99 {r['p99_ms']:.1f} ms, errors {r['errors']}"
        )


def loop_load(folder):
    print("== router overhead on an idle machine (loop-load): shape | added TTFT p50 / p99 ms | direct TTFT p99 ms | proxy CPU ms/req | errors")
    for i, t, r in each_row(folder, "runs"):
        a = r["added_ms"]
        print(
            f"  round {i} {t} {r['shape']:8s} | {a['ttft_p50_ms']:.2f} / {a['ttft_p99_ms']:.2f} | "
            f"{r['direct']['ttft_p99_ms']:.2f} | {r['proxy_cpu_ms_per_req']:.2f} | {r['proxy']['errors'] + r['direct']['errors']}"
        )


if __name__ == "__main__":
    base = sys.argv[1] if len(sys.argv) > 1 else "."
    in_process(f"{base}/in-process-relay", "relay")
    in_process(f"{base}/in-process-router", "router")
    throughput(f"{base}/throughput")
    hit_heavy(f"{base}/hit-heavy")
    loop_load(f"{base}/loop-load")
