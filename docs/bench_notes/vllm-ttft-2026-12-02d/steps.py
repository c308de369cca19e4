"""Where a kvgate arm's time to first token goes beyond vLLM's own, over the runs of the sets
given: the Server-Timing steps each request's record carries (outside the handler, read, hop,
cache, prefix, route, relay; `after` = the client's first token less the head), and the engine
step (the request written until its first event) less vLLM's own mean TTFT, run by run.
Usage: python steps.py set.json [set.json ...]"""

import json
import statistics as st
import sys
from collections import defaultdict

STEPS = ("outside", "read", "hop", "cache", "prefix", "route", "relay", "after")


def main() -> None:
    for arm in ("kvgate_precise", "kvgate_approximate", "kvgate_precise_polled", "kvgate_precise_unpolled"):
        comp, engine_gap, runs = defaultdict(list), [], 0
        for path in sys.argv[1:]:
            r = json.load(open(path))["routers"].get(arm)
            for run in r["runs"] if r else []:
                runs += 1
                for x in run["request_records"]:
                    pm = x["proxy_ms"]
                    for k, v in pm.items():
                        if k != "engine":
                            comp[k].append(v)
                    comp["outside"].append(x["head_s"] * 1000 - sum(pm.values()))
                    comp["after"].append((x["ttft_s"] - x["head_s"]) * 1000)
                gap = st.mean(x["proxy_ms"]["engine"] for x in run["request_records"])
                engine_gap.append(gap - run["engine_ttft_mean_s"] * 1000)
        if not runs:
            continue
        print(f"{arm}: {runs} runs, {len(comp['read'])} requests; ms per request")
        total = 0.0
        for k in STEPS:
            v = sorted(comp[k])
            total += st.mean(v)
            print(f"  {k:8s} mean {st.mean(v):6.2f}  p50 {v[len(v) // 2]:6.2f}  p99 {v[int(len(v) * 0.99)]:7.1f}")
        print(f"  steps' means together {total:.2f}")
        print(
            f"  engine step less vLLM's own TTFT: mean over runs {st.mean(engine_gap):.1f}, "
            f"median {st.median(engine_gap):.1f} (runs {min(engine_gap):.1f} to {max(engine_gap):.1f})"
        )


if __name__ == "__main__":
    main()
