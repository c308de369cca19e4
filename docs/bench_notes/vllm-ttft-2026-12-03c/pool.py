"""This session's sets pooled with the thirty-seventh session's pool (../vllm-ttft-2026-12-03b/pool.txt:
precise 90 runs at 0.9523x, vLLM's own 0.9286x; approximate 75 runs at 0.9607x, 0.9385x), by
../vllm-ttft-2026-12-03/pool.py's main. Usage: python pool.py SET_JSON..."""
import runpy
import sys
from pathlib import Path

PREV = {("kvgate_precise", "ttft_mean_s"): (90, 0.9523), ("kvgate_precise", "engine_ttft_mean_s"): (90, 0.9286),
        ("kvgate_approximate", "ttft_mean_s"): (75, 0.9607), ("kvgate_approximate", "engine_ttft_mean_s"): (75, 0.9385)}
pool = runpy.run_path(str(Path(__file__).parent.parent / "vllm-ttft-2026-12-03" / "pool.py"), run_name="pool")
pool["main"](PREV, sys.argv[1:])
