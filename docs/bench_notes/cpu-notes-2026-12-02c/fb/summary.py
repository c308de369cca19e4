"""The relay with feedback on (the default) and off, alternated (run.sh): per cell, each round's
req/s and CPU ms per request, and off over on paired by round; all-miss C=32 also over
sglang-router's CPU in the same round. Usage: python summary.py (in this folder)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from paired import compare, rows  # noqa: E402

rounds, on, off = compare(HERE, "on", "off")
cell = ("all_miss", 32)
sg = {i: rows(HERE, f"sglang-{i}")[cell]["proxy_cpu_ms_per_req"] for i in rounds}
print("sglang-router CPU per round:", [sg[i] for i in rounds])
print("all-miss C=32 over sglang-router's CPU: on", [round(on[i][cell]["proxy_cpu_ms_per_req"] / sg[i], 2) for i in rounds],
      "off", [round(off[i][cell]["proxy_cpu_ms_per_req"] / sg[i], 2) for i in rounds])
