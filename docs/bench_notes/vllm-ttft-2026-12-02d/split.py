"""Split each kvgate mode's TTFT ratio against sglang-router into vLLM's own TTFT (the placement:
vllm:time_to_first_token_seconds between the run's two reads of each engine's /metrics) and the
time the client saw beyond it (the router's path, both ways, plus vLLM's HTTP front end)."""
import json, sys
from kvgate.tools.bench.vllm_arena_stats import paired_ratio
import statistics as st
for arm in ("kvgate_precise", "kvgate_approximate"):
    kc, sc, ke, se, kadd, sadd = [], [], [], [], [], []
    for path in sys.argv[1:]:
        routers = json.load(open(path))["routers"]
        if arm not in routers: continue
        for rk, rs in zip(routers[arm]["runs"], routers["sglang"]["runs"]):
            kc.append(rk["ttft_mean_s"]); sc.append(rs["ttft_mean_s"])
            ke.append(rk["engine_ttft_mean_s"]); se.append(rs["engine_ttft_mean_s"])
            kadd.append((rk["ttft_mean_s"] - rk["engine_ttft_mean_s"]) * 1000)
            sadd.append((rs["ttft_mean_s"] - rs["engine_ttft_mean_s"]) * 1000)
    n = len(kc)
    print(f"{arm}: {n} runs")
    print("  client TTFT / sglang-router's:", paired_ratio(kc, sc))
    print("  vLLM's own TTFT / sglang-router's:", paired_ratio(ke, se))
    print(f"  time beyond vLLM's TTFT, ms: kvgate mean {st.mean(kadd):.1f} (runs {min(kadd):.1f}-{max(kadd):.1f}), sglang-router {st.mean(sadd):.1f} ({min(sadd):.1f}-{max(sadd):.1f})")
    # what the client ratio would be with kvgate's added time equal to sglang-router's, run by run
    adj = [k - (a - b) / 1000 for k, a, b in zip(kc, kadd, sadd)]
    print("  client TTFT with sglang-router's added time in place of kvgate's:", paired_ratio(adj, sc))
