"""Per mode of the prototypes (prototypes.diff, switched by KVX): the relay's CPU per request in
the all-miss cell at C=32, each round, and over sglang-router's in the same round (and the router
target's, where a round ran it). Usage: python summary.py [folder] (default: this one)."""

import json
import statistics
import sys
from pathlib import Path

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
MODES = ("base", "norec", "merged", "merged_t", "nostore", "bare")


def cpu(name: str, target: str = "kvgate_relay") -> float | None:
    rows = json.loads((HERE / f"{name}.json").read_text())["rows"]
    return next(
        (r["proxy_cpu_ms_per_req"] for r in rows if r["target"] == target and r["mix"] == "all_miss" and r["concurrency"] == 32),
        None,
    )


rounds = sorted({int(p.stem.rsplit("-", 1)[1]) for p in HERE.glob("base-*.json")})
anchor = {i: cpu(f"sglang-{i}", "sglang_router") for i in rounds}
print("sglang-router ms/req per round:", [anchor[i] for i in rounds])
series = {mode: [cpu(f"{mode}-{i}") for i in rounds] for mode in MODES if (HERE / f"{mode}-1.json").exists()}
router = [cpu(f"sglang-{i}", "kvgate_router") for i in rounds]
if all(r is not None for r in router):
    series["router target"] = router
for mode, own in series.items():
    ratios = [o / anchor[i] for o, i in zip(own, rounds)]
    print(
        f"{mode:13} ms/req {own}  mean {statistics.fmean(own):.3f}  over sglang-router {[round(r, 2) for r in ratios]}"
        f"  mean {statistics.fmean(ratios):.2f}x"
    )
