"""Each arm's client TTFT beyond vLLM's own (ms), run by run, with its mean and median, and the
paired ratios of the client's and vLLM's own TTFT against sglang-router (the bench's `paired` and
`paired_engine_ttft`). Usage: python reads.py set.json"""

import json
import statistics as st
import sys

from kvgate.tools.bench.vllm_arena_stats import paired_ratio


def main() -> None:
    d = json.load(open(sys.argv[1]))
    anchor = d["routers"]["sglang"]["runs"]
    for arm, r in d["routers"].items():
        gaps = [(x["ttft_mean_s"] - x["engine_ttft_mean_s"]) * 1000 for x in r["runs"]]
        print(f"{arm}: beyond vLLM's TTFT, ms per run {[round(g, 1) for g in gaps]}")
        print(f"  mean {st.mean(gaps):.1f}, median {st.median(gaps):.1f}; router CPU {r['router_cpu_ms_per_request']} ms per request")
        if arm != "sglang":
            print("  client TTFT / sglang-router's:", paired_ratio([x["ttft_mean_s"] for x in r["runs"]], [x["ttft_mean_s"] for x in anchor]))
            print("  vLLM's own / sglang-router's:", paired_ratio([x["engine_ttft_mean_s"] for x in r["runs"]], [x["engine_ttft_mean_s"] for x in anchor]))


if __name__ == "__main__":
    main()
