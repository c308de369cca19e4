"""Each arm of a set as a row of BENCHMARKS' table: TTFT mean ± 95%, the runs' means, first and
later turns' mean TTFT, router CPU per request (busy), cached fraction, errors. Usage: python
table.py set.json"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "vllm-ttft-2026-12-01c"))
from pool import turn_means  # noqa: E402

NAMES = {"kvgate_precise": "kvgate precise", "kvgate_approximate": "kvgate approximate", "sglang": "sglang-router (anchor)"}

for path in sys.argv[1:]:
    routers = json.load(open(path))["routers"]
    print(path)
    for arm, a in routers.items():
        firsts, laters = zip(*(turn_means(r) for r in a["runs"]))
        print(
            f"| {NAMES.get(arm, arm)} | {a['ttft_mean_s'] * 1e3:.0f} ± {a['ttft_mean_ci_s'] * 1e3:.0f} ms | "
            + ", ".join(f"{r['ttft_mean_s']:.3f}" for r in a["runs"])
            + f" | {sum(firsts) / len(firsts):.3f} / {sum(laters) / len(laters):.3f} | "
            f"{a['router_cpu_ms_per_request']:.1f} (busy {a['router_busy_cpu_ms_per_request']:.1f}) | "
            f"{a['cached_fraction']:.3f} | {a['errors']} / {a['requests']} |"
        )
