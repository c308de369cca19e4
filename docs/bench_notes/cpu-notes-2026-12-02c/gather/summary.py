"""b87b47b (`new`) against it with the group commit's gathering (`g`), alternated (run.sh): per
cell each round's req/s, CPU ms per request and p99, g over new paired by round; the all-miss
C=32 cell over sglang-router's CPU in the same round, with `g` and with `g` and feedback off;
router overhead from loop-load. Usage: python summary.py (in this folder)."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from paired import compare, rows as _rows  # noqa: E402


def rows(name: str) -> dict[tuple[str, int], dict]:
    return _rows(HERE, name)


rounds, new, g = compare(HERE, "new", "g")
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
