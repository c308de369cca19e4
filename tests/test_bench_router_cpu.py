"""`kvgate bench router-cpu` (tools/bench/router_cpu.py): routers in front of simulated vLLM
engines on `kvgate bench vllm`'s conversations, their CPU per request."""

from __future__ import annotations

import argparse
import json

import pytest

from kvgate.tools.bench.procs import sglang_router_bin
from kvgate.tools.bench.router_cpu import add_arguments, cached_fraction, main, summarize, validate
from kvgate.tools.bench.vllm_arena_client import Turn


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_bad_options_are_named():
    bad = validate(
        _args("--arms", "kvgate_precise,nginx", "--rounds", "0", "--anchor", "0.5/8", "--trees", "/nonexistent")
    )
    text = " ".join(bad)
    assert "unknown ['nginx']" in text and "--rounds must be at least 1" in text
    assert "--anchor" in text and "/nonexistent holds no kvgate/" in text
    assert validate(_args()) == []


def test_the_cached_fraction_counts_only_turns_that_reported_usage():
    turns = [Turn(0, 0, [], prompt_tokens=100, cached_tokens=25), Turn(0, 1, [], prompt_tokens=300, cached_tokens=None)]
    assert cached_fraction(turns) == 0.25
    assert cached_fraction([Turn(0, 0, [])]) is None


def test_each_kvgate_row_is_set_against_the_anchor_of_its_own_round():
    rows = [
        {
            "round": 1,
            "arm": "kvgate_precise",
            "tree": "installed",
            "errors": 0,
            "cpu_ms_per_request": 8.0,
            "busy_cpu_ms_per_request": 6.0,
            "idle_cpu_ms_per_s": 1.0,
        },
        {
            "round": 1,
            "arm": "sglang",
            "tree": "installed",
            "errors": 0,
            "cpu_ms_per_request": 3.0,
            "busy_cpu_ms_per_request": 3.0,
            "idle_cpu_ms_per_s": 0.5,
        },
        {
            "round": 2,
            "arm": "kvgate_precise",
            "tree": "installed",
            "errors": 0,
            "cpu_ms_per_request": 9.0,
            "busy_cpu_ms_per_request": 8.0,
            "idle_cpu_ms_per_s": 1.0,
        },
        {
            "round": 2,
            "arm": "sglang",
            "tree": "installed",
            "errors": 0,
            "cpu_ms_per_request": 2.0,
            "busy_cpu_ms_per_request": 2.0,
            "idle_cpu_ms_per_s": 0.5,
        },
    ]
    out = summarize(rows)
    # rounds 2.0x and 4.0x: their geometric mean, not the ratio of the means (7 / 2.5 = 2.8)
    assert out["kvgate_precise"]["busy_over_sglang"]["ratio"] == pytest.approx(2 * 2**0.5, abs=1e-3)
    assert out["kvgate_precise"]["busy_cpu_ms_per_request_mean"] == 7.0
    assert "busy_over_sglang" not in out["sglang"]


@pytest.mark.skipif(sglang_router_bin() is None, reason="sglang-router is installed by make install")
def test_a_short_run_through_kvgate_and_sglang_router(tmp_path):
    out = tmp_path / "cpu.json"
    code = main(
        _args(
            "--rounds",
            "1",
            "--conversations",
            "2",
            "--concurrency",
            "2",
            "--arms",
            "kvgate_precise,sglang",
            "--json",
            str(out),
        )
    )
    assert code == 0
    result = json.loads(out.read_text())
    runs = {r["arm"]: r for r in result["runs"]}
    assert set(runs) == {"kvgate_precise", "sglang"}
    for row in runs.values():
        assert row["requests"] == result["requests_per_run"] == 8 and row["errors"] == 0
        assert row["cpu_ms_per_request"] > 0
    # the same engines' caches behind both: later turns hit what earlier turns left, through either router
    assert runs["kvgate_precise"]["cached_fraction"] == runs["sglang"]["cached_fraction"] > 0
    assert result["summary"]["kvgate_precise"]["busy_over_sglang"]["runs"] == 1
