"""This session's set pooled with the thirty-eighth session's pool (../vllm-ttft-2026-12-03c/pool.txt:
precise 99 runs at 0.9512x, vLLM's own 0.9294x; approximate 84 runs at 0.9545x, 0.9346x), by
../vllm-ttft-2026-12-03/pool.py's main. Usage: python pool.py SET_JSON..."""
import runpy
import sys
from pathlib import Path

PREV = {("kvgate_precise", "ttft_mean_s"): (99, 0.9512), ("kvgate_precise", "engine_ttft_mean_s"): (99, 0.9294),
        ("kvgate_approximate", "ttft_mean_s"): (84, 0.9545), ("kvgate_approximate", "engine_ttft_mean_s"): (84, 0.9346)}
pool = runpy.run_path(str(Path(__file__).parent.parent / "vllm-ttft-2026-12-03" / "pool.py"), run_name="pool")
pool["main"](PREV, sys.argv[1:])
