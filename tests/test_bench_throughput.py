"""`kvgate bench throughput` end to end with tiny counts: every target starts, answers without
errors, and the JSON has the fields docs/BENCHMARKS.md reads (LiteLLM's proxy and sglang-router
are skipped, and say so, where they are not installed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.middleware.cli import build_parser
from kvgate.tools.bench import throughput

ROW_FIELDS = {
    "mix",
    "concurrency",
    "target",
    "requests",
    "errors",
    "elapsed_s",
    "rps",
    "p50_ms",
    "p99_ms",
    "hit_ratio",
    "backend_cpu_ms_per_req",
    "client_cpu_ms_per_req",
}


@pytest.mark.slow
def test_throughput_bench_tiny(tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    argv = [
        "bench",
        "throughput",
        "--requests",
        "160",  # enough requests that each target's CPU spans several clock ticks
        "--duration-s",
        "5",
        "--warmup",
        "8",
        "--concurrency",
        "4",
        "--system-words",
        "40",
        "--question-words",
        "6",
        "--chunk-gap-ms",
        "1",  # the backend spaces each stream's chunks, as an engine does
        "--tokenizer",
        "text",
        "--workdir",
        str(tmp_path / "work"),
        "--json",
        str(out),
    ]
    args = build_parser(argv).parse_args(argv)
    assert throughput.main(args) == 0
    assert list((tmp_path / "work").rglob("cache.db"))  # a work directory the user named stays whole
    result = json.loads(out.read_text())
    assert result["bench"] == "throughput" and result["schema"] == throughput.SCHEMA
    assert result["params"]["chunk_gap_ms"] == 1
    assert set(result["targets"]) == set(throughput.TARGETS)
    ran = {t for t, state in result["targets"].items() if state == "ran"}
    assert {"kvgate_relay", "kvgate_relay_w2", "kvgate_router", "kvgate_backend", "kvgate_litellm", "direct"} <= ran
    for state in result["targets"].values():
        assert state == "ran" or state.startswith("skipped: "), state
    rows = result["rows"]
    assert all(ROW_FIELDS <= set(r) and r["errors"] == 0 and r["requests"] > 0 for r in rows)
    cells = {(r["mix"], r["target"]) for r in rows}
    for target in ran:
        assert ("all_miss", target) in cells
        assert (("hit_heavy", target) in cells) == (target not in throughput.MISS_ONLY)
    by = {(r["mix"], r["target"]): r for r in rows}
    assert by[("hit_heavy", "kvgate_relay")]["hit_ratio"] > 0.3  # repeats are served from the cache
    assert by[("all_miss", "kvgate_relay")]["hit_ratio"] == 0.0
    # the CPU of the target's whole process group: both workers of kvgate_relay_w2
    assert all(r["proxy_cpu_ms_per_req"] > 0 for r in rows if r["target"].startswith("kvgate"))
    assert "proxy_cpu_ms_per_req" not in by[("all_miss", "direct")]
    assert "kvgate_relay/direct" in result["ratios"]["all_miss"]["4"]
    assert by[("hit_heavy", "kvgate_backend")]["hit_ratio"] > 0.3  # the one-backend route caches too
    # routing only: the route stores nothing, so its repeats are misses too
    assert by[("hit_heavy", "kvgate_router")]["hit_ratio"] == 0.0
    if "sglang_router" in ran:
        assert result["ratios"]["all_miss"]["4"]["kvgate_relay/sglang_router_cpu"] > 0
    assert set(result["goals"]) == {
        "relay_all_miss_c32_at_least_sglang_router",
        "relay_all_miss_c32_cpu_at_most_1_5x_sglang_router",
        "relay_at_least_2x_litellm_proxy",
        "relay_all_miss_at_least_half_sglang_router",
        "relay_w2_all_miss_at_least_half_sglang_router",
        "router_all_miss_c32_at_least_sglang_router",
        "router_all_miss_c32_cpu_at_most_1_5x_sglang_router",
    }


def test_hot_parts_times_every_piece() -> None:
    """The micro timings of a relayed miss's pieces run end to end on the real stores and parser."""
    from kvgate.tools.bench.hot_parts import measure

    out = measure(rounds=1, scale=0.02)
    assert set(out) == {
        "sse_stream_18_events_us",
        "sse_stream_18_events_one_read_us",
        "sse_stream_32k_events_ms",
        "build_view_us",
        "request_log_per_record_us",
        "entry_put_per_entry_us",
        "prefix_record_40_blocks_us",
        "router_prompt_hash_us",
        "router_match_us",
        "router_record_prompt_us",
        "router_answer_hash_us",
        "router_record_answer_us",
    }
    assert all(v >= 0 for v in out.values())


def test_hot_parts_times_the_background_gets() -> None:
    from pathlib import Path

    from kvgate.tools.bench.hot_parts import measure_gets

    page = Path(__file__).parent / "data" / "vllm-0.32-metrics.txt"
    out = measure_gets(str(page), rounds=1, scale=0.05)
    assert set(out) == {f"get_{p}_{c}_us" for p in ("metrics_page", "models") for c in ("httpx", "pooled")}
    assert all(v > 0 for v in out.values())


@pytest.mark.parametrize("target", ["router", "relay"])
def test_pipeline_cpu_drives_the_served_app(target: str, tmp_path: Path) -> None:
    """The in-process driver calls the app `kvgate serve` builds, through ASGI, in front of the
    demo backend: every request answered, each response counted, the CPU per request measured."""
    import argparse

    from kvgate.tools.bench import pipeline_cpu

    parser = argparse.ArgumentParser()
    pipeline_cpu.add_arguments(parser)
    out = tmp_path / "cpu.json"
    args = parser.parse_args(
        ["--target", target, "--requests", "40", "--warmup", "8", "--concurrency", "4", "--system-words", "40"]
        + ["--json", str(out)]
    )
    assert pipeline_cpu.main(args) == 0
    result = json.loads(out.read_text())
    assert result["target"] == target and result["errors"] == 0 and result["requests"] == 40
    assert sum(result["sends_per_response"].values()) == 40  # every timed request got a response
    assert min(int(n) for n in result["sends_per_response"]) >= 2  # a start and a body at least
    assert result["cpu_ms_per_request"] > 0


def test_goals_read_the_relay_and_the_like_for_like_router_cells() -> None:
    """The caching relay's goals and routing-only kvgate_router's, from the all-miss C=32 cell."""
    table = {
        "all_miss": {
            "32": {
                "kvgate_relay/sglang_router": 0.9,
                "kvgate_relay/sglang_router_cpu": 2.1,
                "kvgate_router/sglang_router": 1.1,
                "kvgate_router/sglang_router_cpu": 1.45,
            }
        }
    }
    out = throughput.goals(table)
    assert out["relay_all_miss_c32_at_least_sglang_router"] is False
    assert out["relay_all_miss_c32_cpu_at_most_1_5x_sglang_router"] is False
    assert out["router_all_miss_c32_at_least_sglang_router"] is True
    assert out["router_all_miss_c32_cpu_at_most_1_5x_sglang_router"] is True
    assert throughput.goals({})["router_all_miss_c32_cpu_at_most_1_5x_sglang_router"] is None  # not run
