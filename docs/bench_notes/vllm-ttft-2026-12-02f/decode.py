"""Run by run, kvgate's arms against sglang-router's in the same run: the client's whole request
time (`total_mean_s`), vLLM's own time after the first token (its e2e histogram's mean less its
TTFT histogram's mean: the decode, on the engine's clock), the client's mean gap between tokens
(`inter_token_mean_s`, where recorded) and the run's wall time. Usage: python decode.py ARM,ARM... RUN_JSON..."""
import json
import sys

from kvgate.tools.bench.vllm_arena_stats import paired_ratio


def decode(run):
    e2e, ttft = run.get("engine_e2e_mean_s"), run.get("engine_ttft_mean_s")
    return None if e2e is None or ttft is None else e2e - ttft


COLUMNS = {
    "client request time": lambda r: r.get("total_mean_s"),
    "vLLM's decode (e2e - TTFT)": decode,
    "client gap between tokens": lambda r: r.get("inter_token_mean_s"),
    "run's wall time": lambda r: r.get("wall_s"),
    "client TTFT": lambda r: r.get("ttft_mean_s"),
}
for arm in sys.argv[1].split(","):
    print(f"{arm} / sglang-router, run by run:")
    for name, get in COLUMNS.items():
        mine, theirs = [], []
        for path in sys.argv[2:]:
            routers = json.load(open(path))["routers"]
            if arm not in routers or "sglang" not in routers:
                continue
            for a, b in zip(routers[arm]["runs"], routers["sglang"]["runs"]):
                if get(a) and get(b):
                    mine.append(get(a))
                    theirs.append(get(b))
        ratio = paired_ratio(mine, theirs)
        if ratio:
            print(f"  {name}: {ratio['ratio']:.3f}x over {ratio['runs']} runs, 95% {ratio.get('ci95')}")
