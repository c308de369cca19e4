"""h0 (the tree as it is) against h1 (every blob of a stream after its second held until the end:
two writes to the client per request instead of ~17), alternated h0, h1, h0, h1, four runs each,
kvgate precise and sglang-router (anchors at their defaults) in every run: each arm's client
TTFT beyond vLLM's own, run by run. Usage: python summary.py (in this folder)."""

import json
import statistics as st
from pathlib import Path

HERE = Path(__file__).resolve().parent
for m in ("h0", "h1"):
    mine, anchor, cpu = [], [], []
    for i in (1, 2):
        d = json.loads((HERE / f"{m}-{i}.json").read_text())["routers"]
        for a, b in zip(d["kvgate_precise"]["runs"], d["sglang"]["runs"]):
            mine.append((a["ttft_mean_s"] - a["engine_ttft_mean_s"]) * 1000)
            anchor.append((b["ttft_mean_s"] - b["engine_ttft_mean_s"]) * 1000)
        cpu.append(d["kvgate_precise"]["router_cpu_ms_per_request"])
    print(
        f"{m}: kvgate precise beyond vLLM's TTFT, ms per run {[round(x, 1) for x in mine]}: mean {st.mean(mine):.1f},"
        f" median {st.median(mine):.1f}; sglang-router mean {st.mean(anchor):.1f}, median {st.median(anchor):.1f};"
        f" kvgate's CPU per request {cpu}"
    )
