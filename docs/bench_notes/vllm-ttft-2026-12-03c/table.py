"""One set's table (per arm) and its paired ratios against sglang-router. Usage: python table.py vllm.json"""
import json, sys
d = json.load(open(sys.argv[1]))
print("arm | TTFT mean ± 95% ms | vLLM's own ms | beyond vLLM's own ms | before the engine (wire) ms | relay (wire) ms | router CPU ms/request | idle ms/s | busy ms/request | cached | errors | wall s")
for arm, r in d["routers"].items():
    half = (r.get("ttft_mean_ci_s") or float("nan")) * 1000  # the 95% interval's half-width
    print(f"{arm} | {r['ttft_mean_s']*1000:.0f} ± {half:.0f} | {r['engine_ttft_mean_s']*1000:.0f} | {r.get('added_ttft_ms', float('nan')):.1f} | "
          f"{r.get('wire_pre_mean_ms', float('nan')):.2f} | {r.get('wire_post_mean_ms', float('nan')):.2f} | {r['router_cpu_ms_per_request']:.2f} | "
          f"{r.get('router_idle_cpu_ms_per_s', float('nan')):.2f} | {r.get('router_busy_cpu_ms_per_request', float('nan')):.2f} | "
          f"{r['cached_fraction']:.3f} | {r['errors']} / {r['requests']} | {r['wall_s']:.0f}")
for key in ("paired", "paired_engine_ttft"):
    for pair, v in d.get(key, {}).items():
        print(key, pair, {k: v[k] for k in v if not isinstance(v[k], list)})
