"""`kvgate bench kv-remote` at a tiny size: a real redis-server, the real model, two replicas'
stores; the JSON carries issue 14's `kv` fields. Figures are not checked (timing is never pass/fail)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvgate.middleware.cli import main


def test_bench_kv_remote_tiny(tmp_path: Path, capsys) -> None:
    out = tmp_path / "kv.json"
    argv = [
        "bench",
        "kv-remote",
        "--history-tokens",
        "560",
        "--repeats",
        "1",
        "--io-repeats",
        "1",
        "--max-tokens",
        "2",
        "--dir",
        str(tmp_path),
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    kv = r["kv"]
    assert set(kv) == {"remote_load_gbps", "raw_get_gbps", "ttft_cold_s", "ttft_warm_remote_s", "identical_output"}
    assert kv["identical_output"] is True
    for key in ("remote_load_gbps", "raw_get_gbps", "ttft_cold_s", "ttft_warm_remote_s"):
        assert isinstance(kv[key], float) and math.isfinite(kv[key]) and kv[key] > 0, key
    # turn 2 loads every loadable chunk turn 1 left in Redis (and the spilled tail after them)
    assert r["loaded_chunks"] == 2 and r["cached_tokens_warm"] >= 2 * r["chunk_tokens"]
    assert "warm from Redis" in capsys.readouterr().out
    assert not any(tmp_path.glob("kvgate-bench-kv-remote-*"))  # the replicas' directories are removed


def test_bench_kv_remote_rejects_bad_options(capsys) -> None:
    assert main(["bench", "kv-remote", "--history-tokens", "100"]) == 2
    assert "--history-tokens" in capsys.readouterr().err
