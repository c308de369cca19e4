"""`kvgate bench vllm-kv`: kvgate as vLLM's KV tier, against no tier and vLLM's ExampleConnector.

Real vLLM servers (the CPU build, SmolLM2-135M-Instruct, one core each; engines/vllm/launch.py),
started fresh for each phase (tools/bench/vllm_kv_phase.py), and a real Redis:
* cold: no connector. Turn k of each conversation on engine A, its next turn on engine B (which
  never saw it), then A restarted and next turns sent to it; decode speed on both engines.
* example: vLLM's ExampleConnector on a shared directory, same turns.
* kvgate_disk: kvgate's connector over one shared disk directory (default codec int8), same
  turns, the restart, decode speed with saving on.
* kvgate_redis: kvgate's connector over Redis only (the worker's RAM tier in front).
* codec_raw, codec_int4: the disk phase's turns again with the other codecs.
Every phase sends the same prompts: the next turn carries the cold phase's answer to turn k.
Outputs are greedy; "identical" compares a phase's next-turn text with the cold phase's, and
the first token's top-20 logprobs give the largest difference. After the disk phases the bench
reads the stored chunks back itself (page cache dropped first): load GB/s (read, verify,
dequantize) against a plain read of the same files. `--routers` then reruns `kvgate bench vllm`'s
routing comparison with the connector on every engine (tools/bench/vllm_arena.py).

JSON keys: see docs/BENCHMARKS.md, "KV tier for vLLM".
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from kvgate.engines.vllm.launch import default_model_dir, tier_settings, vllm_available, vllm_python
from kvgate.middleware.progress import say as sayer
from kvgate.tools.bench.machine import hardware_info, machine_info
from kvgate.tools.bench.stats import write_json
from kvgate.tools.bench.vllm_kv_client import max_logprob_diff
from kvgate.tools.bench.vllm_kv_phase import PhaseResult, conversations, example_connector_args, run_phase
from kvgate.tools.bench.vllm_kv_read import example_bytes_per_token, read_back
from kvgate.tools.bench.workdir import tidied


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    p.add_argument("--conversations", type=int, default=6, help="long conversations (history >= --history-tokens)")
    p.add_argument("--short", type=int, default=14, help="shorter conversations added to the codec comparison")
    p.add_argument("--history-tokens", type=int, default=1800)
    p.add_argument("--short-history-tokens", type=int, default=500)
    p.add_argument("--restarts", type=int, default=3, help="conversations whose next turn follows A's restart")
    p.add_argument("--decode-runs", type=int, default=4, help="long generations per engine for decode tokens/s")
    p.add_argument("--decode-tokens", type=int, default=192)
    p.add_argument(
        "--itl-loads",
        type=int,
        default=4,
        help="histories loaded from disk into B during its decode stream, for the p99 inter-token latency (0: skip)",
    )
    p.add_argument("--codecs", default="raw,int4", help="codecs besides the default int8 (comma list; '' for none)")
    p.add_argument("--routers", action="store_true", help="also rerun the routing comparison with the connector")
    p.add_argument("--router-runs", type=int, default=3)
    p.add_argument("--router-args", default="", help="more `kvgate bench vllm` arguments for --routers (one string)")
    p.add_argument("--workdir", type=Path, default=None, help="tiers and logs here (default: a temp dir)")


def mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def compare(phase: PhaseResult, cold: PhaseResult) -> dict[str, Any]:
    same = [r.text == c.text for r, c in zip(phase.next_turn, cold.next_turn)]
    diffs = [d for r, c in zip(phase.next_turn, cold.next_turn) if (d := max_logprob_diff(r.top, c.top)) is not None]
    return {
        "identical": same,
        "identical_fraction": sum(same) / len(same) if same else None,
        "max_logprob_diff": max(diffs, default=None),
    }


def main(args: argparse.Namespace) -> int:
    if not vllm_available():
        print(
            f"kvgate bench vllm-kv: vLLM's environment is missing ({vllm_python()}); run `make install`",
            file=sys.stderr,
        )
        return 2
    from kvgate.tools.redis_proc import RedisServer

    model = str(default_model_dir())
    work = args.workdir or Path(tempfile.mkdtemp(prefix="kvgate-bench-vllm-kv-"))
    logs = work / "logs"
    codecs = [c for c in args.codecs.split(",") if c]
    long_convs = conversations(0, args.conversations, args.history_tokens)
    short_convs = conversations(100, args.short, args.short_history_tokens)
    restart_convs = conversations(200, args.restarts, args.history_tokens)
    everything = long_convs + short_convs
    t_start = time.perf_counter()
    say = sayer("bench vllm-kv")
    phases: dict[str, PhaseResult] = {}

    def phase(name: str, **kw: Any) -> PhaseResult:
        phases[name] = run_phase(
            name,
            model,
            logs,
            everything if kw.pop("all_convs", True) else long_convs,
            say=say,
            decode_tokens=args.decode_tokens,
            warm_tokens=args.history_tokens,
            **kw,
        )
        say(f"[{name}] done in {phases[name].seconds:.0f} s")
        return phases[name]

    cold = phase("cold", restart=restart_convs, decode_runs=args.decode_runs)
    example_dir = work / "example"
    example = phase("example", all_convs=False, extra_args=example_connector_args(example_dir))
    disk_dirs = {"int8": work / "tier-int8"}
    disk = phase(
        "kvgate_disk",
        connector=tier_settings(disk_dirs["int8"]),
        restart=restart_convs,
        decode_runs=args.decode_runs,
        itl=conversations(300, args.itl_loads, args.history_tokens),
    )
    redis = RedisServer().start()
    try:
        remote = phase("kvgate_redis", all_convs=False, connector=tier_settings(None, redis.url))
    finally:
        redis.stop()
    for codec in codecs:
        disk_dirs[codec] = work / f"tier-{codec}"
        phase(f"codec_{codec}", connector=tier_settings(disk_dirs[codec], codec=codec))

    n_long = len(long_convs)
    # three read-backs per tier (this disk's speed varies between reads): the median by read speed
    reads = {
        codec: sorted((read_back(d) for _ in range(3)), key=lambda r: r["read_gbps"] or 0)[1]
        for codec, d in disk_dirs.items()
    }
    history = mean([r.prompt_tokens for r in cold.turn_k[:n_long]]) or 0
    codec_phase = {"int8": disk, **{c: phases[f"codec_{c}"] for c in codecs}}
    codec_report = {}
    for codec, ph in codec_phase.items():
        cmp = compare(ph, cold)
        codec_report[codec] = {
            "bytes_per_token": reads[codec]["bytes_per_token"],
            "identical_fraction": cmp["identical_fraction"],
            "max_logprob_diff": cmp["max_logprob_diff"],
            # reading, verifying and dequantizing one history's chunks, page cache dropped
            "load_s": reads[codec]["load_s"] / reads[codec]["tokens"] * history if reads[codec]["tokens"] else None,
            "ttft_next_turn_s": mean([r.ttft_s for r in ph.next_turn[:n_long]]),
        }
    loads_ok = (
        compare(disk, cold)["identical"][:n_long]
        + compare(remote, cold)["identical"]
        + [r.text == c.text for r, c in zip(disk.restart_next, cold.restart_next)]
    )
    result: dict[str, Any] = {
        "history_tokens": history,
        "next_turn_prompt_tokens": mean([r.prompt_tokens for r in cold.next_turn[:n_long]]),
        "ttft_cold_s": mean([r.ttft_s for r in cold.next_turn[:n_long]]),
        "ttft_example_connector_s": mean([r.ttft_s for r in example.next_turn]),
        "ttft_kvgate_disk_s": mean([r.ttft_s for r in disk.next_turn[:n_long]]),
        "ttft_kvgate_redis_s": mean([r.ttft_s for r in remote.next_turn]),
        "ttft_restart_cold_s": mean([r.ttft_s for r in cold.restart_next]),
        "ttft_restart_kvgate_s": mean([r.ttft_s for r in disk.restart_next]),
        "identical_output": all(loads_ok),
        "identical_loads": f"{sum(loads_ok)}/{len(loads_ok)}",
        "bytes_per_token": {
            "example_connector": example_bytes_per_token(example_dir),
            "kvgate_raw": codec_report.get("raw", {}).get("bytes_per_token"),
            "kvgate_compressed": codec_report["int8"]["bytes_per_token"],
        },
        "compressed_identical_fraction": codec_report["int8"]["identical_fraction"],
        "codecs": codec_report,
        "disk_load_gbps": reads["int8"]["read_gbps"],
        "raw_disk_read_gbps": reads["int8"]["raw_read_gbps"],
        "disk_load_with_dequant_gbps": reads["int8"]["load_gbps"],
        "disk_read_detail": reads,
        "decode_tps_ratio": (mean(disk.decode_tps) / mean(cold.decode_tps))
        if cold.decode_tps and disk.decode_tps
        else None,
        "decode_tps": {"without": cold.decode_tps, "with_saving": disk.decode_tps},
        # one decode stream on B with --itl-loads histories loading from disk beside it, and alone
        "itl_p99_during_loads_s": disk.itl.get("itl_p99_during_loads_s"),
        "itl_p99_no_loads_s": disk.itl.get("itl_p99_no_loads_s"),
        "itl_detail": disk.itl,
        "cached_tokens_next_turn": {
            name: [r.cached_tokens for r in ph.next_turn[:n_long]] for name, ph in phases.items()
        },
        "ttft_next_turn_each_s": {name: [round(r.ttft_s, 4) for r in ph.next_turn] for name, ph in phases.items()},
        "ttft_restart_each_s": {
            "cold": [round(r.ttft_s, 4) for r in cold.restart_next],
            "kvgate_disk": [round(r.ttft_s, 4) for r in disk.restart_next],
        },
        # the floor: the same next turns again on B, from its own prefix cache (no load), and how
        # often vLLM's own prefix cache reproduces the cold output (the control for "identical")
        "ttft_engine_prefix_hit_s": mean([r.ttft_s for r in cold.again[:n_long]]),
        "prefix_cache_identical_fraction": sum(r.text == c.text for r, c in zip(cold.again, cold.next_turn))
        / len(cold.again)
        if cold.again
        else None,
        "connector_counters_after_next_turns": {name: ph.connector for name, ph in phases.items() if ph.connector},
        "load_s_per_next_turn": {
            name: ph.connector.get("vllm:kvgate_load_seconds_total", 0.0)
            / max(1.0, ph.connector.get("vllm:kvgate_loads_total", 0.0))
            for name, ph in phases.items()
            if ph.connector
        },
        "example_connector_identical_fraction": compare(example, cold)["identical_fraction"],
        "phases_s": {name: round(ph.seconds, 1) for name, ph in phases.items()},
        "prompts": {
            "long": n_long,
            "short": len(short_convs),
            "restart": len(restart_convs),
            "history_tokens_wanted": args.history_tokens,
        },
        "machine": machine_info(),
        "hardware": hardware_info(work),
        "command": "kvgate bench vllm-kv "
        + " ".join(sys.argv[3:] if sys.argv[1:3] == ["bench", "vllm-kv"] else sys.argv[1:]),
    }
    if args.routers:
        from kvgate.tools.bench.vllm_kv_routers import routers_with_connector

        result["routers"] = routers_with_connector(work, args.router_runs, args.router_args.split())
    result["seconds"] = round(time.perf_counter() - t_start, 1)
    write_json(args.json, result)
    if args.workdir is None:  # a directory the user named stays whole
        say(tidied(work))
    keys = (
        "ttft_cold_s",
        "ttft_example_connector_s",
        "ttft_kvgate_disk_s",
        "ttft_kvgate_redis_s",
        "ttft_restart_cold_s",
        "ttft_restart_kvgate_s",
        "identical_output",
        "compressed_identical_fraction",
        "disk_load_gbps",
        "raw_disk_read_gbps",
        "decode_tps_ratio",
    )
    for k in keys:
        say(f"{k}: {result[k]}")
    return 0
