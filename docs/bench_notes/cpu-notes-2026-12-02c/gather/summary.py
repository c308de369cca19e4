"""b87b47b (`new`) against it with the group commit's gathering (`g`), alternated (run.sh): per
cell each round's req/s, CPU ms per request and p99, g over new paired by round; the all-miss
C=32 cell over sglang-router's CPU in the same round, with `g` and with `g` and feedback off;
router overhead from loop-load. Usage: python summary.py (in this folder)."""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
rounds = sorted({int(p.stem.split("-")[1]) for p in HERE.glob("new-*.json")})


def rows(name: str) -> dict[tuple[str, int], dict]:
    return {(r["mix"], r["concurrency"]): r for r in json.loads((HERE / f"{name}.json").read_text())["rows"]}


new = {i: rows(f"new-{i}") for i in rounds}
g = {i: rows(f"g-{i}") for i in rounds}
for cell in new[rounds[0]]:
    a, b = [new[i][cell] for i in rounds], [g[i][cell] for i in rounds]
    cpu = statistics.fmean(y["proxy_cpu_ms_per_req"] / x["proxy_cpu_ms_per_req"] for x, y in zip(a, b))
    rps = statistics.fmean(y["rps"] / x["rps"] for x, y in zip(a, b))
    print(
        f"{cell[0]:9} C={cell[1]:3} new req/s {[r['rps'] for r in a]} CPU {[r['proxy_cpu_ms_per_req'] for r in a]} p99 {[r['p99_ms'] for r in a]}"
        f" | g req/s {[r['rps'] for r in b]} CPU {[r['proxy_cpu_ms_per_req'] for r in b]} p99 {[r['p99_ms'] for r in b]}"
        f" | g/new CPU {cpu:.3f} req/s {rps:.3f} | errors {sum(r['errors'] for r in a + b)}"
    )
cell = ("all_miss", 32)
sg = {i: rows(f"sglang-{i}")[cell] for i in rounds}
off = {i: rows(f"g-fboff-{i}")[cell] for i in rounds}
print("sglang-router req/s, CPU per round:", [(sg[i]["rps"], sg[i]["proxy_cpu_ms_per_req"]) for i in rounds])
for name, series in (("new", new), ("g", g)):
    print(f"all-miss C=32 {name} over sglang-router: CPU", [round(series[i][cell]["proxy_cpu_ms_per_req"] / sg[i]["proxy_cpu_ms_per_req"], 3) for i in rounds],
          "req/s", [round(series[i][cell]["rps"] / sg[i]["rps"], 3) for i in rounds])
print("all-miss C=32 g, feedback off, over sglang-router: CPU", [round(off[i]["proxy_cpu_ms_per_req"] / sg[i]["proxy_cpu_ms_per_req"], 3) for i in rounds],
      "req/s", [round(off[i]["rps"] / sg[i]["rps"], 3) for i in rounds])
for p in sorted(HERE.glob("ll-*.json")):  # added = proxy minus direct, per shape
    for r in json.loads(p.read_text())["runs"]:
        added = {k: round(r["proxy"][k] - r["direct"][k], 2) for k in ("ttft_p50_ms", "ttft_p99_ms", "total_p50_ms", "total_p99_ms")}
        print(p.stem, r["shape"], "added", added, "proxy CPU ms/req", round(r["proxy_cpu_ms_per_req"], 2), "errors", r["proxy"]["errors"])
