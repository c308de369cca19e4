"""The thirtieth session's A/B: start (88512e4) against a later tree ("new"), alternated, the
order swapped each round. Geometric means with a Student's t interval; new over start paired by
round. Run from this folder: python summary.py > summary.txt (53d3e41), python summary.py
first > first/summary.txt (the first runs: see README)."""

import glob
import importlib.util
import json
from pathlib import Path

# the geometric mean with its t interval, as the twenty-ninth session's summary writes it
_spec = importlib.util.spec_from_file_location("summary29", Path(__file__).parent.parent / "cpu-notes-2026-12-02" / "summary.py")
_summary29 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_summary29)
gm = _summary29.gm
TREES = ("head", "new")


def rounds(folder):
    n = len(glob.glob(f"{folder}/head-*.json"))
    return [i for i in range(1, n + 1) if glob.glob(f"{folder}/new-{i}.json")]


def load(folder, t, i):
    return json.load(open(f"{folder}/{t}-{i}.json"))


def in_process(folder, label):
    print(f"== in process, {label}: CPU ms per request (pipeline_cpu)")
    per, paired = {t: [] for t in TREES}, []
    for i in rounds(folder):
        row = {t: load(folder, t, i) for t in TREES}
        for t in TREES:
            per[t].append(row[t]["cpu_ms_per_request"])
        paired.append(per["new"][-1] / per["head"][-1])
        print(f"  round {i}: start {per['head'][-1]:.3f} ms ({row['head']['rps']:.0f} req/s), "
              f"new {per['new'][-1]:.3f} ms ({row['new']['rps']:.0f} req/s), errors {row['head']['errors']}/{row['new']['errors']}")
    for t in TREES:
        print(f"  {t}: {gm(per[t])} ms")
    print(f"  new/start, paired: {gm(paired)}")


def hit_heavy(folder):
    print("== hit-heavy relay (bench throughput --targets kvgate_relay --mixes hit_heavy --concurrency 32,128)")
    for c in (32, 128):
        rps, cpu, paired = {t: [] for t in TREES}, {t: [] for t in TREES}, []
        for i in rounds(folder):
            cells = []
            for t in TREES:
                row = next(r for r in load(folder, t, i)["rows"] if r["concurrency"] == c)
                rps[t].append(row["rps"])
                cpu[t].append(row["proxy_cpu_ms_per_req"])
                cells.append(f"{t} {row['rps']:.0f} req/s, {row['proxy_cpu_ms_per_req']:.3f} ms, hits {row['hit_ratio']}, err {row['errors']}")
            paired.append(rps["new"][-1] / rps["head"][-1])
            print(f"  C={c} round {i}: " + " | ".join(cells))
        for t in TREES:
            print(f"  C={c} {t}: req/s {gm(rps[t])}; CPU ms/req {gm(cpu[t])}")
        print(f"  C={c} new/start req/s, paired: {gm(paired)}")


def goal_cell(folder):
    print("== goal cell: all_miss, C=32; each kvgate target over sglang-router in the same run")
    for target in ("kvgate_relay", "kvgate_router"):
        cpu, rps, paired = {t: [] for t in TREES}, {t: [] for t in TREES}, []
        print(f" -- {target}")
        for i in rounds(folder):
            cells = []
            for t in TREES:
                rows = {r["target"]: r for r in load(folder, t, i)["rows"]}
                k, s = rows[target], rows["sglang_router"]
                cpu[t].append(k["proxy_cpu_ms_per_req"] / s["proxy_cpu_ms_per_req"])
                rps[t].append(k["rps"] / s["rps"])
                cells.append(f"{t}: {k['proxy_cpu_ms_per_req']:.3f}/{s['proxy_cpu_ms_per_req']:.3f} ms = {cpu[t][-1]:.3f}, "
                             f"req/s {k['rps']:.0f}/{s['rps']:.0f}, err {k['errors']}/{s['errors']}")
            paired.append(cpu["new"][-1] / cpu["head"][-1])
            print(f"  round {i}: " + " | ".join(cells))
        for t in TREES:
            print(f"  {t}: CPU/req over sglang-router's {gm(cpu[t])}; req/s over sglang-router's {gm(rps[t])}")
        print(f"  new/start CPU ratio, paired by round: {gm(paired)}")


def loop_load(folder):
    print("== router overhead on an idle machine (loop-load): shape | added TTFT p50 / p99 ms | direct TTFT p99 ms | proxy CPU ms/req | errors")
    for i in rounds(folder):
        for t in TREES:
            for row in load(folder, t, i)["runs"]:
                a, errors = row["added_ms"], row["proxy"]["errors"] + row["direct"]["errors"]
                print(f"  round {i} {t:4} {row['shape']:8} | {a['ttft_p50_ms']:.2f} / {a['ttft_p99_ms']:.2f} | "
                      f"{row['direct']['ttft_p99_ms']:.2f} | {row['proxy_cpu_ms_per_req']:.2f} | {errors}")


if __name__ == "__main__":
    import sys

    base = sys.argv[1] if len(sys.argv) > 1 else "."
    parts = (
        ("ipl", lambda f: in_process(f, "relay, 4,000-word system prompts (record steps in worker threads)")),
        ("ll", loop_load),
        ("hh", hit_heavy),
        ("tp", goal_cell),
    )
    for name, show in parts:
        if glob.glob(f"{base}/{name}/head-*.json"):
            show(f"{base}/{name}")
