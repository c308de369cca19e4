import json, os
print("round tree shape | added TTFT p50 / p99 ms | direct TTFT p99 ms | proxy CPU ms/req | errors")
for i, order in ((1, ("new", "base")), (2, ("base", "new"))):
    for t in order:
        if not os.path.exists(f"{t}-{i}.json"): continue
        for r in json.load(open(f"{t}-{i}.json"))["runs"]:
            a = r["added_ms"]
            print(f"{i} {t} {r['shape']:8s} | {a['ttft_p50_ms']:.2f} / {a['ttft_p99_ms']:.2f} | {r['direct']['ttft_p99_ms']:.2f} | {r['proxy_cpu_ms_per_req']:.2f} | {r['proxy']['errors'] + r['direct']['errors']}")
