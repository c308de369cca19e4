"""The issue's throughput matrix, three runs: every cell's req/s, CPU per request, p99, errors and
hit ratio per run, each run's goal verdicts as the bench wrote them, and each kvgate target over
sglang-router per run. Usage: python summary.py (in this folder)."""

import json

runs = [json.load(open(f"run-{i}.json")) for i in (1, 2, 3)]
for i, run in enumerate(runs, 1):
    print(f"run {i} goals: {run.get('goals')}")
cells: dict[tuple[str, int, str], list[dict]] = {}
for run in runs:
    for row in run["rows"]:
        cells.setdefault((row["mix"], row["concurrency"], row["target"]), []).append(row)
print("mix C target | req/s per run | CPU ms/req per run | p99 ms per run | errors | hit ratio")
for (mix, c, target), rows in cells.items():
    print(
        f"{mix} {c} {target:14s} | "
        + " / ".join(f"{r['rps']:.0f}" for r in rows)
        + " | "
        + " / ".join(f"{r['proxy_cpu_ms_per_req']:.3f}" for r in rows)
        + " | "
        + " / ".join(f"{r['p99_ms']:.0f}" for r in rows)
        + f" | {sum(r['errors'] for r in rows)} | {rows[0]['hit_ratio']}"
    )
for mix, c, target in cells:
    anchor = cells.get((mix, c, "sglang_router"))
    if target.startswith("kvgate") and anchor:
        mine = cells[(mix, c, target)]
        cpu = [round(m["proxy_cpu_ms_per_req"] / a["proxy_cpu_ms_per_req"], 3) for m, a in zip(mine, anchor)]
        rps = [round(m["rps"] / a["rps"], 3) for m, a in zip(mine, anchor)]
        print(f"{mix} {c} {target} over sglang-router per run: CPU {cpu} req/s {rps}")
