"""The relay with feedback on (the default) and off, alternated (run.sh): per cell, each round's
req/s and CPU ms per request, and off over on paired by round; all-miss C=32 also over
sglang-router's CPU in the same round. Usage: python summary.py (in this folder)."""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
rounds = sorted({int(p.stem.split("-")[1]) for p in HERE.glob("on-*.json")})


def rows(name: str) -> dict[tuple[str, int], dict]:
    return {(r["mix"], r["concurrency"]): r for r in json.loads((HERE / f"{name}.json").read_text())["rows"]}


on = {i: rows(f"on-{i}") for i in rounds}
off = {i: rows(f"off-{i}") for i in rounds}
sg = {i: rows(f"sglang-{i}")[("all_miss", 32)]["proxy_cpu_ms_per_req"] for i in rounds}
for cell in on[rounds[0]]:
    a = [on[i][cell] for i in rounds]
    b = [off[i][cell] for i in rounds]
    cpu = [y["proxy_cpu_ms_per_req"] / x["proxy_cpu_ms_per_req"] for x, y in zip(a, b)]
    rps = [y["rps"] / x["rps"] for x, y in zip(a, b)]
    print(
        f"{cell[0]:9} C={cell[1]:3}  on req/s {[r['rps'] for r in a]} CPU {[r['proxy_cpu_ms_per_req'] for r in a]}"
        f" | off req/s {[r['rps'] for r in b]} CPU {[r['proxy_cpu_ms_per_req'] for r in b]}"
        f" | off/on CPU {statistics.fmean(cpu):.3f} req/s {statistics.fmean(rps):.3f}"
        f" | errors {sum(r['errors'] for r in a + b)}"
    )
cell = ("all_miss", 32)
print("sglang-router CPU per round:", [sg[i] for i in rounds])
print("all-miss C=32 over sglang-router's CPU: on", [round(on[i][cell]["proxy_cpu_ms_per_req"] / sg[i], 2) for i in rounds],
      "off", [round(off[i][cell]["proxy_cpu_ms_per_req"] / sg[i], 2) for i in rounds])
