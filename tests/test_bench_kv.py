"""`kvgate bench kv` at a tiny size (the real model over a real ChunkStore on disk), and the cheap
parts of `kvgate bench e2e` (option checks, deterministic openings)."""

from __future__ import annotations

import json
import math

import pytest

from kvgate.middleware.cli import main
from kvgate.tools.bench.kv import fit, history, sentences


def test_bench_kv_tiny(tmp_path, capsys):
    out = tmp_path / "kv.json"
    argv = [
        "bench",
        "kv",
        "--history-tokens",
        "600",
        "--repeats",
        "1",
        "--io-repeats",
        "1",
        "--max-tokens",
        "4",
        "--drop-page-cache",
        "fadvise",
        "--dir",
        str(tmp_path),
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert 500 <= r["history_tokens"] <= 600
    assert r["identical_output"] is True
    assert r["loaded_chunks"] == (r["history_tokens"] - 1) // r["chunk_tokens"] == 2
    for key in (
        "ttft_cold_s",
        "ttft_warm_ram_s",
        "ttft_warm_disk_s",
        "ttft_warm_disk_pagecache_s",
        "disk_load_gbps",
        "disk_read_gbps",
        "decode_gbps",
        "raw_disk_read_gbps",
        "ram_load_gbps",
        "warm_ram_speedup",
        "warm_disk_speedup",
        "disk_vs_raw",
    ):
        assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, key
    for mode in ("cold", "warm_ram", "warm_disk", "warm_disk_pagecache"):
        m = r["modes"][mode]
        assert len(m["ttft_runs_s"]) == len(m["load_runs_s"]) == len(m["prefill_runs_s"]) == 1
        # warm: the full chunks and the partial tail after them (RAM, or spilled to disk): all
        # but the one token that must be fed
        expected = {"cold": 0}.get(mode, r["history_tokens"] - 1)
        assert m["cached_tokens"] == expected, mode
        assert m["prefill_s"] > 0
    assert r["decoded_bytes"] > 0 and r["stored_bytes"] >= r["decoded_bytes"]
    assert set(r["page_cache"]) >= {"applied", "methods"} and "drop_caches" not in r["page_cache"]["methods"]
    assert r["machine"]["cpus"] >= 1
    assert "warm_ram" in capsys.readouterr().out
    assert not any(tmp_path.glob("kvgate-bench-kv-*"))  # the store's directory is removed


def test_history_fits_the_target_and_is_deterministic():
    count = lambda msgs: sum(len(m["content"].split()) for m in msgs)  # noqa: E731
    msgs, n = fit(history, count, 300, hi=100)
    k = sum(m["content"].count("Record ") for m in msgs)
    assert n == count(msgs) <= 300 < count(history(k + 1))
    assert msgs == fit(history, count, 300, hi=100)[0]
    assert sentences(3, 5) == sentences(3, 5) != sentences(4, 5)


@pytest.mark.parametrize(
    "bad",
    [
        ["--replicas", "0"],
        ["--turns", "0"],
        ["--policies", "nope"],
        ["--policies", "round_robin,round_robin"],
        ["--max-tokens", "0"],
        ["--opening-min-tokens", "900", "--opening-max-tokens", "600"],
        ["--arrival-s", "-1"],
    ],
)
def test_bench_e2e_rejects_bad_options_before_starting_anything(bad, capsys):
    assert main(["bench", "e2e", *bad]) == 2
    assert "kvgate bench e2e: error" in capsys.readouterr().err


def test_arrivals_are_seeded_and_spread_when_asked():
    from kvgate.tools.bench.e2e import arrivals

    assert arrivals(4, 0.0, 0) == [0.0] * 4
    a = arrivals(200, 2.0, 7)
    assert a == arrivals(200, 2.0, 7) != arrivals(200, 2.0, 8)
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:]))
    assert 1.5 < a[-1] / 199 < 2.5  # mean gap near 2 s


def test_kv_working_set_counts_full_chunks_of_each_conversations_end():
    from kvgate.tools.bench.e2e import kv_bytes_per_token, kv_working_set, store_capacity_mb

    smollm2 = {"num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576, "num_hidden_layers": 30}
    assert kv_bytes_per_token(smollm2) == 2 * 30 * 3 * 64 * 4 == 46080
    assert kv_bytes_per_token({**smollm2, "num_key_value_heads": None}, dtype_bytes=2) == 2 * 30 * 9 * 64 * 2
    records = [
        {"conversation": 0, "prompt_tokens": 600},
        {"conversation": 0, "prompt_tokens": 700},
        {"conversation": 1, "prompt_tokens": 250},
        {"conversation": 2, "prompt_tokens": None},
    ]
    # conversation 0 ends at 700 + 16 = 716 tokens -> 2 full chunks of 256; conversation 1 at 266 -> 1
    assert kv_working_set(records, 16, 256, 10) == (512 + 256) * 10
    assert store_capacity_mb(160, 256) == 256 and store_capacity_mb(512, 0) == 512
