"""The routing benchmarks run end to end on tiny settings (figures are not asserted, shapes are)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from kvgate.middleware.cli import main

TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "mooncake_conversation_trace.jsonl"


def test_routing_arena_tiny(tmp_path):
    out = tmp_path / "arena.json"
    rc = main(
        [
            "bench",
            "routing",
            "--trace",
            str(TRACE),
            "--limit",
            "40",
            "--speed",
            "40",
            "--replicas",
            "2",
            "--capacity-tokens",
            "200000",
            "--policies",
            "round_robin,cache_aware,sglang,vllm_router",
            "--json",
            str(out),
            "--plot",
            str(tmp_path / "cdf.png"),
        ]
    )
    assert rc == 0
    assert (tmp_path / "cdf.png").read_bytes()[:4] == b"\x89PNG"  # the TTFT CDF from the per-request TTFTs
    r = json.loads(out.read_text())
    assert r["requests"] == 40 and 0 <= r["ceiling_lru"] <= r["ceiling_infinite"] <= 1
    assert r["report_slice"] == "0:40" and r["tune_slice"] is None and r["capacity_hint"] == "none"
    for name in ("round_robin", "cache_aware", "sglang", "vllm_router"):
        p = r["policies"][name]
        assert p["errors"] == 0 and p["completed"] == 40, p
        assert 0 <= p["hit_rate"] <= 1 and p["ttft_p50_s"] > 0 and sum(p["requests_per_replica"]) == 40
        assert {"ttft_p99_s", "ttft_mean_s", "imbalance"} <= set(p)
        assert len(p["ttfts_s"]) == 40 and p["ttfts_s"] == sorted(p["ttfts_s"])
    # every request of this trace shares its first 512-token block: some prefix reuse must show
    assert r["policies"]["cache_aware"]["hit_rate"] > 0
    assert "router_estimate_mean" in r["policies"]["cache_aware"]["queued_check"]


def test_routing_arena_with_several_client_processes(tmp_path):
    """--clients 2: the requests are split between two load-generator processes on one schedule;
    every request is still sent once and measured once."""
    out = tmp_path / "arena.json"
    rc = main(
        [
            "bench",
            "routing",
            "--trace",
            str(TRACE),
            "--limit",
            "30",
            "--speed",
            "40",
            "--replicas",
            "2",
            "--capacity-tokens",
            "200000",
            "--policies",
            "round_robin,cache_aware",
            "--clients",
            "2",
            "--per-request",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["clients"] == 2
    for name in ("round_robin", "cache_aware"):
        p = r["policies"][name]
        assert p["errors"] == 0 and p["completed"] == 30 and sum(p["requests_per_replica"]) == 30, p
        assert len(p["ttfts_s"]) == 30 and min(p["ttfts_s"]) > 0
        assert 0 <= p["client_lag_p99_s"] <= p["client_lag_max_s"]  # both processes' probes, pooled
        # --per-request: every request once, read from the replica's own answer (its name, its usage)
        rows = p["per_request"]
        assert [i for i, *_ in rows] == list(range(30)) and all(c is not None and c >= 0 for _, _, c, _ in rows)
        served = Counter(n for _, n, _, _ in rows)
        assert sorted(served.values()) == sorted(c for c in p["requests_per_replica"] if c)
        assert set(served) <= {"r0", "r1"}
    assert sum(c for _, _, c, _ in r["policies"]["cache_aware"]["per_request"]) > 0
    # bench routing-hits rebuilds each replica's cache from those rows; the request-level flips add
    # up to the two routers' hit-rate gap
    hits = tmp_path / "hits.json"
    assert main(["bench", "routing-hits", str(out), "--json", str(hits)]) == 0
    h = json.loads(hits.read_text())["results"][0]
    for name in ("round_robin", "cache_aware"):
        s = h["routers"][name]
        assert s["hit_rate"] == pytest.approx(r["policies"][name]["hit_rate"])
        assert 0 <= s["reconstructed_hit_rate"] <= 1 and s["routed_away"] >= 0 and s["held_nowhere"] >= 0
    f = h["vs_cache_aware"]["round_robin"]
    gap = r["policies"]["round_robin"]["hit_rate"] - r["policies"]["cache_aware"]["hit_rate"]
    assert f["theirs_more"] - f["theirs_fewer"] == pytest.approx(gap, abs=1e-9)
    assert r["policies"]["round_robin"]["requests_per_replica"] == [15, 15]


def _stream_events() -> bytes:
    chunk = {
        "id": "x",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": None}],
    }
    return (
        b": keep-alive\n\n"
        + b"data: "
        + json.dumps(chunk, separators=(",", ":")).encode()
        + b"\n\n"
        + b'data: {"error":{"message":"replica gone"}}\n\n'
    )


def test_stream_scan_finds_content_and_errors_whatever_the_chunking():
    """The load generator reads raw bytes: the first content and an in-band error are found at
    the same byte however the stream is cut."""
    from kvgate.tools.bench.stream_client import StreamScan

    data = _stream_events()
    content_end = data.index(b'"content"') + len(b'"content"')
    error_end = data.index(b'data: {"error"') + len(b'data: {"error"')
    for size in (1, 2, 3, 7, 13, 64, len(data)):
        scan, seen_at, error_at = StreamScan(), None, None
        for start in range(0, len(data), size):
            piece = data[start : start + size]
            if scan.feed(piece) and seen_at is None:
                seen_at = start + len(piece)
            if scan.error is not None and error_at is None:
                error_at = start + len(piece)
        assert seen_at == min(len(data), -(-content_end // size) * size), size
        assert error_at == min(len(data), -(-error_end // size) * size), size
        assert scan.error.startswith('data: {"error"')
    quiet = StreamScan()
    assert not quiet.feed(b": keep-alive\n\n") and quiet.error is None


def test_routing_arena_refuses_no_clients(capsys):
    try:
        main(["bench", "routing", "--trace", str(TRACE), "--clients", "0"])
    except SystemExit as exc:
        assert "--clients must be at least 1" in str(exc)
    else:
        raise AssertionError("--clients 0 was accepted")


def test_routing_arena_tunes_on_its_own_slice_batched(tmp_path, capsys):
    """Tuning runs on the tuning slice only; the pick is reported; the batched model serves;
    --table prints the JSON's table."""
    out = tmp_path / "arena.json"
    rc = main(
        [
            "bench",
            "routing",
            "--trace",
            str(TRACE),
            "--tune-slice",
            "0:20",
            "--report-slice",
            "20:40",
            "--speed",
            "40",
            "--replicas",
            "2",
            "--capacity-tokens",
            "200000",
            "--policies",
            "cache_aware,vllm_router",
            "--anchor-grid",
            "0.3/64/1.5,0.5/4/1.1",
            "--sim-model",
            "batched",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["tune_slice"] == "0:20" and r["report_slice"] == "20:40" and r["sim_model"] == "batched"
    cands = r["tuning"]["candidates"]["vllm_router"]
    assert len(cands) == 2 and r["tuning"]["chosen"]["vllm_router"] in [c["params"] for c in cands]
    assert r["policies"]["vllm_router"]["params"] == r["tuning"]["chosen"]["vllm_router"]
    assert r["policies"]["cache_aware"]["errors"] == 0 and r["policies"]["cache_aware"]["completed"] == 20
    capsys.readouterr()
    assert main(["bench", "routing", "--table", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| **kvgate cache_aware** |" in table and "vllm-router" in table and "slice 20:40 reported" in table
    # the same run twice: the pooled table (one scenario, 2 runs; no sglang here), then the summary
    # with each router's mean share of the TTFT (client − engine)
    assert main(["bench", "routing", "--table", str(out), str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| scenario | runs | goal met |") and lines[2].split("|")[2].strip() == "2"
    top = lines.index(next(line for line in lines if "client − engine" in line))
    ca, vl = r["policies"]["cache_aware"], r["policies"]["vllm_router"]
    share = [f"{(x['ttft_mean_s'] - x['engine_ttft_mean_s']) * 1000:.0f} ms" for x in (ca, vl)]
    assert f"| {share[0]} / – / {share[1]} |" in lines[top + 2]


def test_gen_trace_is_seeded_and_shaped(tmp_path):
    from kvgate.tools.bench.trace import load_trace
    from kvgate.tools.bench.trace_gen import TraceShape, describe, generate

    a, b = generate(TraceShape(requests=2000, seed=3)), generate(TraceShape(requests=2000, seed=3))
    assert a == b and a != generate(TraceShape(requests=2000, seed=4))
    d = describe(a)
    assert 13_000 <= d["mean"] <= 18_000 and 10_000 <= d["median"] <= 13_500 and 100_000 <= d["max"] <= 190_000
    for row in a:
        assert len(row["hash_ids"]) == -(-row["input_length"] // 512)
    # a session's turns extend the previous turn's ids; sessions share only system prefixes (ids <= 64)
    sessions: dict[int, list[int]] = {}
    for row in a:
        key = next(h for h in row["hash_ids"] if h > 8 * 8)
        prev = sessions.get(key)
        assert prev is None or (row["hash_ids"][: len(prev)] == prev and len(row["hash_ids"]) >= len(prev))
        sessions[key] = row["hash_ids"]
    assert 500 < len(sessions) < 1500  # mean ~2 turns a session
    out = tmp_path / "t.jsonl"
    assert main(["bench", "gen-trace", "--out", str(out), "--requests", "50", "--seed", "1"]) == 0
    assert [r.input_length for r in load_trace(out)] == [
        r["input_length"] for r in generate(TraceShape(requests=50, seed=1))
    ]


def test_route_overhead_tiny(tmp_path):
    out = tmp_path / "ro.json"
    assert main(["bench", "route-overhead", "--indexed-blocks", "20000", "--samples", "20", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["indexed_blocks"] == 20000 and r["decision_p50_ms"] > 0 and r["chose_prefix_holder_fraction"] == 1.0


def test_routing_model_is_deterministic_and_ranks_the_rules(tmp_path):
    """The virtual-time arena: same figures every run; cache-aware routing beats round robin on
    hits in it as in the live arena."""
    from kvgate.middleware.routing import make_policy
    from kvgate.tools.bench.arena_model import SglangRule, prepare, simulate

    reqs = prepare(TRACE, 0, 200)
    a = simulate(reqs, make_policy("cache_aware"))
    assert a == simulate(reqs, make_policy("cache_aware"))
    rr = simulate(reqs, make_policy("round_robin"))
    assert a["hit_rate"] > rr["hit_rate"] and 0 < a["ttft_p50_s"] <= a["ttft_p99_s"]
    assert 0 < simulate(reqs, SglangRule())["hit_rate"] <= 1
    resident = simulate(reqs, make_policy("cache_aware", new_sessions="resident"))
    assert resident["hit_rate"] > rr["hit_rate"]  # starts placed by residents, histories kept
    out = tmp_path / "m.json"
    assert (
        main(
            [
                "bench",
                "routing-model",
                "--trace",
                str(TRACE),
                "--slices",
                "0:60",
                "--candidates",
                "miss_weight=8;queue_slack=.inf",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [r["rule"] for r in rows][:2] == ["sglang", "vllm_router"] and len(rows) == 4


def test_pooled_table_groups_runs_of_one_setting_and_counts_the_goal():
    from kvgate.tools.bench.arena_table import pooled

    def run(trace, model, speed, ca_hit, sg_hit, vl_hit, ca_p99=1.0, sg_p99=2.0, name=None):
        pol = lambda hit, p99: {"hit_rate": hit, "ttft_p99_s": p99, "errors": 0}  # noqa: E731
        return {
            "scenario": name or f"{trace} ×{speed}, {model}",
            "trace": f"/x/{trace}.jsonl",
            "sim_model": model,
            "speed": speed,
            "policies": {
                "cache_aware": pol(ca_hit, ca_p99),
                "sglang": pol(sg_hit, sg_p99),
                "vllm_router": pol(vl_hit, 3.0),
            },
        }

    text = pooled(
        [
            run("conv", "fifo", 10, 0.212, 0.210, 0.211),
            run("long", "fifo", 4, 0.50, 0.49, 0.49),
            # the same setting under another label, and a run that misses by hit rate
            run("conv", "fifo", 10.0, 0.210, 0.211, 0.209, ca_p99=1.5, name="conv x10 fifo"),
        ]
    )
    rows = [line for line in text.splitlines()[2:] if line]
    assert len(rows) == 3  # two settings, then every run together
    conv = [c.strip() for c in rows[0].strip("|").split("|")]
    assert conv[:3] == ["conv ×10, fifo", "2", "1"]
    assert conv[3] == "+0.0005 (-0.0010)" and conv[4] == "+0.0010 (+0.0010)"
    assert conv[5] == "×0.75"
    assert [c.strip() for c in rows[1].strip("|").split("|")][:3] == ["long ×4, fifo", "1", "1"]
    every = [c.strip() for c in rows[2].strip("|").split("|")]
    assert every[:3] == ["**all runs**", "3", "2"] and every[3].startswith("+0.0037 (-0.0010), 95% CI ")


def test_mean_interval_is_the_normal_interval_of_the_mean():
    from kvgate.tools.bench.arena_table import mean_interval

    assert mean_interval([0.5]) == (0.5, 0.5, 0.5)
    mean, low, high = mean_interval([1.0, 2.0, 3.0])  # sd 1, n 3
    assert (
        mean == 2.0
        and abs(high - mean - 1.959963984540054 / 3**0.5) < 1e-12
        and abs((mean - low) - (high - mean)) < 1e-12
    )


def test_table_and_routing_hits_name_a_file_that_is_not_an_arena_result(tmp_path):
    other = tmp_path / "routing-hits.json"
    other.write_text(json.dumps({"runs": []}))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    for path, says in (
        (other, "is not a `kvgate bench routing --json` result (no scenario, trace"),
        (broken, "cannot read"),
    ):
        for command in (["bench", "routing", "--table"], ["bench", "routing-hits"]):
            with pytest.raises(SystemExit) as stop:
                main([*command, str(path)])
            assert str(path) in str(stop.value) and says in str(stop.value)
