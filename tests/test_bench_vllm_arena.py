"""`kvgate bench vllm`'s pure parts: conversations from a trace, the oracle, vLLM's /metrics, the
JSON shape. No vLLM server is started here (the bench itself is run by hand: see its docstring)."""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

import pytest

from kvgate.middleware.config import parse_config
from kvgate.tools.bench.trace import TraceRequest
from kvgate.tools.bench.vllm_arena import ARMS, add_arguments, run_order, validate
from kvgate.tools.bench.vllm_arena_client import Turn, inter_token_gaps, inter_token_s, take_event
from kvgate.tools.bench.vllm_arena_setup import kvgate_config, serve_argv
from kvgate.tools.bench.vllm_arena_stats import (
    Computed,
    added_ttft_ms,
    computed_per_server,
    counters,
    loop_lag,
    metric_labels,
    oracle_cached,
    paired_ratio,
    paired_ratios,
    router_summary,
    run_summary,
    runs_to_resolve,
)
from kvgate.tools.bench.vllm_arena_workload import (
    WORDS,
    block_words,
    estimate_tokens,
    group_conversations,
    select,
    user_texts,
)


def req(t: float, n: int, ids: list[int]) -> TraceRequest:
    return TraceRequest(t, n, 1, tuple(ids))


def test_conversations_grouped_on_full_blocks():
    trace = [
        req(0, 1300, [0, 1, 2]),  # A1: full blocks (0, 1)
        req(1, 1200, [0, 7, 8]),  # B1: shares only block 0 with A: its own conversation
        req(2, 1800, [0, 1, 5, 6]),  # A2: starts with A1's full blocks, longer
        req(3, 1250, [0, 7, 9]),  # B2: starts with B1's full blocks (0, 7), longer
        req(4, 1000, [0, 7, 9]),  # shorter than B2: not a turn of B, a new conversation (1 full block: no tail)
        req(5, 2100, [0, 1, 5, 11, 12]),  # A3: starts with A2's full blocks (0, 1, 5)
        req(6, 400, [0]),  # too short to be extended (< 2 full blocks)
        req(7, 900, [0, 13]),  # not a turn of the 400-token request
    ]
    convs = group_conversations(trace)
    assert [c.requests for c in convs] == [(0, 2, 5), (1, 3), (4,), (6,), (7,)]
    a = convs[0]
    assert a.new_ids == ((0, 1, 2), (5, 6), (11, 12))  # turn k: its ids beyond turn k-1's full blocks
    assert convs[1].new_ids == ((0, 7, 8), (9,))


def test_conversations_follow_the_latest_turn_and_time_order():
    trace = [req(10, 2100, [0, 1, 5, 11, 12]), req(0, 1300, [0, 1, 2]), req(5, 1800, [0, 1, 5, 6])]
    convs = group_conversations(trace)  # sorted by time first
    assert [c.requests for c in convs] == [(1, 2, 0)]
    # a request extending turn 1 once turn 2 exists starts a new conversation
    trace.append(req(20, 1400, [0, 1, 3]))
    assert [c.requests for c in group_conversations(trace)] == [(1, 2, 0), (3,)]


def test_select_cuts_and_filters():
    trace = [req(k, 1100 + 600 * k, [0, 1, *range(10, 10 + k + 1)]) for k in range(5)]  # one 5-turn conversation
    trace += [req(100 + k, 1100 + 16000 * k, [0, 2, *range(50, 50 + 32 * k + 1)]) for k in range(4)]  # too long
    trace += [req(200 + k, 1100 + 600 * k, [0, 3, *range(90, 90 + k + 1)]) for k in range(3)]  # 3 turns only
    convs = group_conversations(trace)
    assert sorted(c.turns for c in convs) == [3, 4, 5]
    picked, counts = select(convs, 3, 64, 16, 3500)
    assert counts == {"conversations": 3, "with_enough_turns": 2, "fitting": 1}
    assert [c.turns for c in picked] == [3] and picked[0].requests == (0, 1, 2)
    assert picked[0].new_ids == ((0, 1, 10), (10, 11), (11, 12))  # beyond the previous turn's full blocks
    assert estimate_tokens(picked[0], 3, 64, 16) == 40 + 7 * 64 + 2 * 16 + 5 * 5


def test_block_text_is_deterministic_and_block_tokens_long():
    conv = group_conversations([req(0, 1100, [0, 1, 2]), req(1, 1600, [0, 1, 4, 5])])[0]
    texts = user_texts(conv, 8)
    assert texts == user_texts(conv, 8)
    assert [len(t.split()) for t in texts] == [24, 16]
    assert texts[0].startswith(block_words(0, 8)) and block_words(0, 8) != block_words(1, 8)
    assert set(" ".join(texts).split()) <= set(WORDS)


def test_words_are_one_token_each():
    from kvgate.engines.vllm.launch import default_model_dir

    path = default_model_dir() / "tokenizer.json"
    if not path.exists():
        pytest.skip("no SmolLM2 tokenizer (kvgate prepare)")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    assert all(len(tok.encode(" " + w, add_special_tokens=False).ids) == 1 for w in WORDS)
    assert len(tok.encode(" " + block_words(3, 64), add_special_tokens=False).ids) == 64


def test_oracle_counts_whole_blocks_of_earlier_finished_sequences():
    a = Computed(0, 1, list(range(10)), [100, 101])  # computes 0..9, 100, 101
    b = Computed(2, 3, [*range(10), 100, 101, 7, 7, 7])  # shares 12 tokens = 3 blocks of 4
    c = Computed(2.5, 4, list(range(9)))  # a's first 2 blocks; 8 of 9 tokens
    d = Computed(5, 6, list(range(8)))  # exactly 2 blocks: the last token is never a hit
    e = Computed(0.5, 7, [50, 51, 52, 53, 54])  # nothing before it shares its first block
    hits = oracle_cached([a, b, c, d, e], 4)
    assert hits == [0, 12, 8, 4, 0]
    # sent before `a` finished: nothing to hit
    assert oracle_cached([Computed(0, 5, list(range(9))), Computed(1, 2, list(range(9)))], 4) == [0, 0]
    # a prefix that diverges inside block 2 hits block 1 only
    assert oracle_cached([Computed(0, 1, list(range(12))), Computed(2, 3, [0, 1, 2, 3, 4, 9, 6, 7, 8, 9])], 4) == [0, 4]
    with pytest.raises(ValueError):
        oracle_cached([], 0)


METRICS = """# HELP vllm:prompt_tokens_total x
vllm:prompt_tokens_total{engine="0",model_name="smollm2"} 2044.0
vllm:prompt_tokens_cached_total{engine="0",model_name="smollm2"} 512.0
vllm:prompt_tokens_cached_created{engine="0",model_name="smollm2"} 1.7e+09
vllm:external_prefix_cache_hits_total{engine="0",model_name="smollm2"} 256.0
vllm:cache_config_info{block_size="128",engine="0",kv_cache_size_tokens="46592",prefix_caching_hash_algo="sha256"} 1.0
"""


def test_metrics_read():
    assert counters([METRICS, METRICS.replace("2044.0", "100")]) == {
        "cached": 1024.0,
        "prompt": 2144.0,
        "external": 512.0,
    }
    info = metric_labels(METRICS, "vllm:cache_config_info")
    assert info["kv_cache_size_tokens"] == "46592" and info["block_size"] == "128"
    assert metric_labels(METRICS, "vllm:nothing") == {}


def test_computed_tokens_per_server_from_vllms_own_page():
    """A real vLLM 0.32 page: prompt tokens less prefix-cache hits is what vLLM itself counts as
    computed locally (its by-source counter), per server and between two reads."""
    page = (Path(__file__).parent / "data" / "vllm-0.32-metrics.txt").read_text()
    local = sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith("vllm:prompt_tokens_by_source_total") and 'source="local_compute"' in line
    )
    assert local > 0
    assert computed_per_server(["", page], [page, page]) == [int(local), 0]


def test_stream_events_folded():
    t = Turn(0, 0, [], sent=1.0)
    take_event(t, {"choices": [{"delta": {"role": "assistant", "content": ""}}]}, 1.5)
    assert t.ttft is None  # an empty content is not the first token
    take_event(t, {"choices": [{"delta": {"content": "Hi"}}]}, 2.0)
    take_event(t, {"choices": [{"delta": {"content": " there"}, "finish_reason": "length"}]}, 2.1)
    take_event(
        t, {"choices": [], "usage": {"prompt_tokens": 300, "prompt_tokens_details": {"cached_tokens": 256}}}, 2.2
    )
    assert t.ttft == 1.0 and "".join(t.pieces) == "Hi there" and t.finish_reason == "length"
    assert (t.prompt_tokens, t.cached_tokens) == (300, 256)
    take_event(t, {"error": {"message": "boom"}}, 3)
    assert "boom" in t.error


def test_the_gap_between_tokens_is_over_the_pieces_after_the_first():
    """Three pieces at 2.0, 2.1 and 2.4 s: two gaps, 0.2 s on average; an empty content and the
    usage chunk are not pieces; one piece has no gap."""
    t = Turn(0, 0, [], sent=1.0)
    take_event(t, {"choices": [{"delta": {"role": "assistant", "content": ""}}]}, 1.5)
    for now, text in ((2.0, "a"), (2.1, "b"), (2.4, "c")):
        take_event(t, {"choices": [{"delta": {"content": text}}]}, now)
    take_event(t, {"choices": [], "usage": {"prompt_tokens": 3}}, 3.0)
    assert inter_token_s(t) == pytest.approx(0.2)
    one = Turn(0, 1, [], sent=1.0)
    take_event(one, {"choices": [{"delta": {"content": "x"}}]}, 1.2)
    assert inter_token_s(one) is None and inter_token_gaps([t, one]) == [pytest.approx(0.2)]


def test_json_shape_from_fake_runs():
    runs = [
        run_summary([0.1, 0.2, 0.3], [], 3, {"prompt": 0, "cached": 0}, {"prompt": 1000, "cached": 400}),
        run_summary([0.2, 0.4], ["HTTP 500"], 3, {"prompt": 1000, "cached": 400}, {"prompt": 2000, "cached": 1000}),
    ]
    assert runs[1]["cached_fraction"] == 0.6 and runs[1]["errors"] == 1
    s = router_summary(runs, router="kvgate cache_aware")
    assert {
        "ttft_mean_s",
        "ttft_mean_ci_s",
        "ttft_p50_s",
        "ttft_p90_s",
        "cached_fraction",
        "errors",
        "requests",
        "runs",
    } <= set(s)
    assert math.isclose(s["ttft_mean_s"], (0.2 + 0.3) / 2)
    half = statistics.NormalDist().inv_cdf(0.975) * statistics.stdev([0.2, 0.3]) / math.sqrt(2)
    assert math.isclose(s["ttft_mean_ci_s"], half)
    assert s["cached_fraction"] == 1000 / 2000 and s["errors"] == 1 and s["requests"] == 6 and len(s["runs"]) == 2
    assert s["ttft_p50_s"] == 0.2 and s["ttft_p90_s"] == 0.4
    one = router_summary(runs[:1])
    assert one["ttft_mean_ci_s"] is None and math.isclose(one["ttft_mean_s"], 0.2)


def test_paired_ratios_run_by_run():
    """A ratio per run, their geometric mean, and Student's t interval on the log ratios."""
    runs = {
        "kvgate_precise": [
            {"run": 1, "ttft_mean_s": 0.9},
            {"run": 2, "ttft_mean_s": 2.0},
            {"run": 3, "ttft_mean_s": 1.1},
        ],
        "sglang": [{"run": 1, "ttft_mean_s": 1.0}, {"run": 2, "ttft_mean_s": 2.0}, {"run": 3, "ttft_mean_s": 1.0}],
        "vllm_router": [{"run": 2, "ttft_mean_s": 1.0}],
    }
    out = paired_ratios(runs, ["kvgate_precise", "kvgate_approximate"], ["sglang", "vllm_router"])
    assert set(out) == {"kvgate_precise/sglang", "kvgate_precise/vllm_router"}
    logs = [math.log(0.9), 0.0, math.log(1.1)]
    assert out["kvgate_precise/sglang"]["ratio"] == round(math.exp(statistics.fmean(logs)), 4)
    half = 4.303 * statistics.stdev(logs) / math.sqrt(3)
    low, high = out["kvgate_precise/sglang"]["ci95"]
    assert math.isclose(low, math.exp(statistics.fmean(logs) - half), abs_tol=1e-4)
    assert math.isclose(high, math.exp(statistics.fmean(logs) + half), abs_tol=1e-4)
    assert out["kvgate_precise/sglang"]["sd_log"] == round(statistics.stdev(logs), 4)
    assert out["kvgate_precise/sglang"]["runs_to_resolve"] == runs_to_resolve(statistics.stdev(logs))
    # one common run (run 2): its ratio, no interval, no spread
    assert out["kvgate_precise/vllm_router"] == {"ratio": 2.0, "runs": 1}
    assert paired_ratio([1.0], [0.0]) is None and paired_ratio([], []) is None


def test_runs_to_resolve_grows_with_the_square_of_the_spread():
    # (1.96 + 0.842) * 0.14 / -ln(0.95) = 7.65 -> 58.5 runs
    assert runs_to_resolve(0.14) == 59
    assert runs_to_resolve(0.07) == 15  # half the spread, a quarter of the runs (rounded up)
    assert runs_to_resolve(0.0) == 2  # no spread: still a pair of runs
    assert runs_to_resolve(0.14, difference=0.10) < runs_to_resolve(0.14)
    # what it promises, checked by simulation: at that many runs a true 5% difference shows in the
    # interval about 80% of the time
    rng = random.Random(7)
    n, sd, shown = runs_to_resolve(0.14), 0.14, 0
    for _ in range(2000):
        logs = [rng.gauss(math.log(0.95), sd) for _ in range(n)]
        half = 2.0 * statistics.stdev(logs) / math.sqrt(n)
        shown += statistics.fmean(logs) + half < 0
    assert 0.74 <= shown / 2000 <= 0.86


class _Server:
    def __init__(self, i: int) -> None:
        self.api_base, self.events = f"http://127.0.0.1:{8000 + i}/v1", f"tcp://127.0.0.1:{5000 + i}"


def test_kvgate_configs_are_valid(tmp_path):
    servers = [_Server(0), _Server(1)]
    for arm in ("kvgate_precise", "kvgate_approximate", "round_robin"):
        cfg = parse_config(kvgate_config(arm, servers, tmp_path / arm, "/models/smollm2"))
        route = cfg.routes[0]
        assert route.exact is False and route.semantic.enabled is False
        assert [r.api_base for r in route.replicas] == [s.api_base for s in servers]
    precise = kvgate_config("kvgate_precise", servers, tmp_path, "/m")["routes"][0]
    assert precise["routing"] == {
        "policy": "cache_aware",
        "prefix": {"mode": "precise"},
    }  # block size, tokenizer: the engine's
    assert [r["events"] for r in precise["replicas"]] == [s.events for s in servers]
    approx = kvgate_config("kvgate_approximate", servers, tmp_path, "/m")["routes"][0]["routing"]
    assert approx == {"policy": "cache_aware", "prefix": {"mode": "approximate", "tokenizer": "/m"}}
    for arm, mode in (("kvgate_precise_prefill_time", "precise"), ("kvgate_approximate_prefill_time", "approximate")):
        route = parse_config(kvgate_config(arm, servers, tmp_path / arm, "/m")).routes[0]
        assert (route.routing.policy.name, route.routing.prefix.mode) == ("prefill_time", mode)
        assert all(r.events for r in route.replicas) == (mode == "precise")
    resident = parse_config(kvgate_config("kvgate_precise_resident", servers, tmp_path / "res", "/m")).routes[0]
    assert (resident.routing.policy.name, resident.routing.policy.new_sessions) == ("cache_aware", "resident")
    assert resident.routing.prefix.mode == "precise" and all(r.events for r in resident.replicas)
    polled = parse_config(kvgate_config("kvgate_precise_polled", servers, tmp_path / "pol", "/m"))
    assert polled.stats.scrape_replicas == "always"
    unpolled = parse_config(kvgate_config("kvgate_precise_unpolled", servers, tmp_path / "unp", "/m"))
    assert unpolled.stats.scrape_replicas == "never" and unpolled.routes[0].routing.prefix.mode == "precise"
    assert (
        parse_config(kvgate_config("kvgate_precise", servers, tmp_path / "p", "/m")).stats.scrape_replicas == "watched"
    )
    two = parse_config(kvgate_config("kvgate_precise_w2", servers, tmp_path / "w2", "/m")).routes[0]
    assert two.routing.prefix.mode == "precise" and all(r.events for r in two.replicas)
    decode = parse_config(kvgate_config("kvgate_precise_decode", servers, tmp_path / "dec", "/m")).routes[0]
    assert (decode.routing.policy.name, decode.routing.policy.decode_weight) == ("cache_aware", 1024)
    assert decode.routing.prefix.mode == "precise" and resident.routing.policy.decode_weight == 8.0


def test_serve_argv_runs_the_arms_workers(tmp_path):
    def workers(arm):
        argv = serve_argv(arm, tmp_path / "c.yaml", 8123)
        assert argv[argv.index("--config") + 1] == str(tmp_path / "c.yaml") and "8123" in argv
        return argv[argv.index("--workers") + 1]

    assert workers("kvgate_precise_w2") == "2"
    assert workers("kvgate_precise") == "1" and workers("kvgate_approximate") == "1"


def test_options_checked():
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert validate(p.parse_args(["--json", "x"])) == []
    assert validate(p.parse_args(["--json", "x", "--arms", ",".join(ARMS)])) == []
    bad = validate(p.parse_args(["--json", "x", "--arms", "kvgate_precise,nope", "--concurrency", "1", "--runs", "0"]))
    assert (
        any("--arms" in m for m in bad) and any("--concurrency" in m for m in bad) and any("--runs" in m for m in bad)
    )


def test_the_replay_arm_needs_the_run_it_replays_first():
    p = argparse.ArgumentParser()
    add_arguments(p)
    for arms in ("replay_precise", "replay_precise,kvgate_precise", "sglang,replay_precise"):
        assert any("replay_precise" in m for m in validate(p.parse_args(["--json", "x", "--arms", arms]))), arms
    assert validate(p.parse_args(["--json", "x", "--arms", "kvgate_precise,sglang,replay_precise"])) == []


def test_each_arm_takes_every_position_equally_often_and_the_replay_stays_after_its_run():
    arms = ["kvgate_precise", "kvgate_approximate", "sglang", "replay_precise"]
    orders = [run_order(arms, r) for r in range(6)]
    assert orders[0] == arms
    for order in orders:
        assert sorted(order) == sorted(arms) and order[-1] == "replay_precise"
    rotating = arms[:-1]
    for arm in rotating:  # over 6 runs (twice the 3 rotating arms) each position twice
        assert sorted(o.index(arm) for o in orders) == [0, 0, 1, 1, 2, 2]
    assert run_order(["sglang"], 4) == ["sglang"]


def test_router_nice_is_checked_and_wraps_every_router(tmp_path):
    from kvgate.tools.bench.vllm_arena_bench import Bench

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert any("--router-nice" in m for m in validate(p.parse_args(["--json", "x", "--router-nice", "-21"])))
    args = p.parse_args(["--json", "x", "--router-nice", "5"])
    assert validate(args) == []
    assert Bench(args, tmp_path).niced(["r", "--x"]) == ["nice", "-n", "5", "r", "--x"]
    assert Bench(p.parse_args(["--json", "x"]), tmp_path).niced(["r"]) == ["r"]
    # a slice: every router through the launcher (which execs it), under nice when both are asked
    assert any("--router-slice-us 20" in m for m in validate(p.parse_args(["--json", "x", "--router-slice-us", "20"])))
    both = Bench(p.parse_args(["--json", "x", "--router-nice", "5", "--router-slice-us", "300"]), tmp_path)
    assert both.niced(["r"]) == ["nice", "-n", "5", sys.executable, "-m", "kvgate.tools.bench.sliced", "300", "--", "r"]


def test_an_answer_that_ends_at_once_still_has_a_first_token() -> None:
    # the model's first token may be its end: the stream carries a finish_reason and no content
    turn = Turn(0, 0, [], sent=1.0)
    take_event(turn, {"choices": [{"delta": {"role": "assistant"}, "finish_reason": None}]}, 1.1)
    take_event(turn, {"choices": [{"delta": {}, "finish_reason": "stop"}]}, 1.5)
    assert turn.ttft == pytest.approx(0.5) and turn.finish_reason == "stop" and turn.error is None


def test_a_lost_port_is_read_from_the_new_part_of_the_log_only(tmp_path: Path) -> None:
    from kvgate.engines.vllm.launch import lost_a_port

    log = tmp_path / "vllm-0.log"
    assert not lost_a_port(None) and not lost_a_port(log)
    log.write_text("INFO starting\nzmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:41019')\n")
    seen = log.stat().st_size
    assert lost_a_port(log)
    with open(log, "a") as f:
        f.write("INFO started again\nRuntimeError: Engine core initialization failed\n")
    assert not lost_a_port(log, seen)  # this attempt failed for another reason: not started again


def test_loop_lag_reads_the_routers_histogram_between_two_pages():
    def page(counts: list[int], total: float) -> str:
        edges = ["0.005", "0.01", "0.05", "0.1", "+Inf"]
        lines = [f'kvgate_event_loop_lag_seconds_bucket{{le="{e}"}} {c}' for e, c in zip(edges, counts)]
        return "\n".join(
            [*lines, f"kvgate_event_loop_lag_seconds_count {counts[-1]}", f"kvgate_event_loop_lag_seconds_sum {total}"]
        )

    before = page([10, 10, 10, 10, 10], 0.01)
    after = page([50, 80, 95, 98, 110], 3.01)  # 100 samples in between, 3 s of lag in all
    lag = loop_lag(before, after)
    assert lag == {"samples": 100, "mean_ms": 30.0, "over_10ms": 0.3, "over_50ms": 0.15, "over_100ms": 0.12}
    assert loop_lag(after, after) is None
    assert loop_lag("", "") is None


def test_the_clients_ttft_splits_into_vllms_own_and_what_the_path_added():
    """vLLM's own TTFT is paired run by run like the client's, and the time beyond it is each
    run's difference, averaged (runs missing either figure left out)."""
    runs = {
        "kvgate_precise": [
            {"run": 1, "ttft_mean_s": 0.50, "engine_ttft_mean_s": 0.45},
            {"run": 2, "ttft_mean_s": 0.60, "engine_ttft_mean_s": 0.57},
            {"run": 3, "ttft_mean_s": 0.70, "engine_ttft_mean_s": None},
        ],
        "sglang": [
            {"run": 1, "ttft_mean_s": 0.50, "engine_ttft_mean_s": 0.49},
            {"run": 2, "ttft_mean_s": 0.60, "engine_ttft_mean_s": 0.59},
            {"run": 3, "ttft_mean_s": 0.70, "engine_ttft_mean_s": 0.69},
        ],
    }
    engine = paired_ratios(runs, ["kvgate_precise"], ["sglang"], key="engine_ttft_mean_s")["kvgate_precise/sglang"]
    assert engine["runs"] == 2
    assert engine["ratio"] == round(math.exp(statistics.fmean([math.log(0.45 / 0.49), math.log(0.57 / 0.59)])), 4)
    client = paired_ratios(runs, ["kvgate_precise"], ["sglang"])["kvgate_precise/sglang"]
    assert client["ratio"] == 1.0 and client["runs"] == 3
    assert math.isclose(added_ttft_ms(runs["kvgate_precise"]), (50 + 30) / 2)
    assert math.isclose(added_ttft_ms(runs["sglang"]), 10.0)
    assert added_ttft_ms([{"run": 1, "ttft_mean_s": 0.5}]) is None
    tokens = {"prompt_tokens": 100, "cached_tokens": 50, "errors": 0, "requests": 1}
    assert router_summary([{**r, **tokens} for r in runs["kvgate_precise"]])["added_ttft_ms"] == 40.0
