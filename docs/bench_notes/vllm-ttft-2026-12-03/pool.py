"""This session's sets pooled with the thirty-fifth session's pool (../vllm-ttft-2026-12-02f/power-pool.txt:
precise 70 runs at 0.9674x, vLLM's own 0.9409x; approximate 55 runs at 0.9809x, 0.9558x), run by run
geometric means of kvgate / sglang-router. Usage: python pool.py SET_JSON...
A later pool names its own PREV and calls main(PREV, paths)."""
import json
import math
import statistics as st
import sys

PREV = {("kvgate_precise", "ttft_mean_s"): (70, 0.9674), ("kvgate_precise", "engine_ttft_mean_s"): (70, 0.9409),
        ("kvgate_approximate", "ttft_mean_s"): (55, 0.9809), ("kvgate_approximate", "engine_ttft_mean_s"): (55, 0.9558)}


def main(PREV, paths):
    sets = [json.load(open(p))["routers"] for p in paths]
    for (arm, col), (n, ratio) in PREV.items():
        logs = [math.log(k[col] / s[col]) for R in sets for k, s in zip(R[arm]["runs"], R["sglang"]["runs"])]
        total = n * math.log(ratio) + sum(logs)
        print(f"{arm} {col}: this session {math.exp(st.fmean(logs)):.3f} over {len(logs)} runs (sd of the log {st.stdev(logs):.3f}); "
              f"pooled {math.exp(total / (n + len(logs))):.4f} over {n + len(logs)} runs (before {ratio})")
    for arm in ("kvgate_precise", "kvgate_approximate", "sglang"):
        runs = [r for R in sets for r in R[arm]["runs"]]
        n = sum(r["wire_requests"] for r in runs)
        pre = sum(r["wire_pre_mean_ms"] * r["wire_requests"] for r in runs) / n
        post = sum(r["wire_post_mean_ms"] * r["wire_requests"] for r in runs) / n
        print(f"{arm}: before the engine {pre:.2f} ms, relay {post:.2f} ms over {len(runs)} runs ({n} requests); "
              f"medians of the runs' p50 {st.median(r['wire_pre_p50_ms'] for r in runs):.2f} / {st.median(r['wire_post_p50_ms'] for r in runs):.2f} ms")


if __name__ == "__main__":
    main(PREV, sys.argv[1:])
