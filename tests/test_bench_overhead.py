"""`kvgate bench loop-load --rate`: the router-overhead run end to end on tiny settings (figures are
not asserted, the JSON's shape is: every tokenizer × shape row, both phases, the added latency)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.middleware.cli import build_parser
from kvgate.tools.bench import loop_load


@pytest.mark.slow
def test_overhead_run_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "overhead.json"
    argv = [
        "bench",
        "loop-load",
        "--rate",
        "5",
        "--duration-s",
        "2",  # the proxy samples its loop lag every 250 ms under load: a few samples
        "--prompt-words",
        "60",
        "--tokenizers",
        "text",
        "--shapes",
        "fresh,continue",
        "--conversations",
        "3",
        "--json",
        str(out),
    ]
    args = build_parser(argv).parse_args(argv)
    assert loop_load.main(args) == 0
    # the work directory it made keeps the logs and configs, not the proxy's caches
    said = capsys.readouterr().err
    work = Path(said.split("logs and configs kept in ", 1)[1].split(";", 1)[0])
    assert sorted(p.name for p in work.glob("*.log")) == ["demo.log", "proxy-text.log"]
    assert (work / "text.yaml").exists() and not list(work.rglob("cache.db"))
    runs = json.loads(out.read_text())["runs"]
    assert [(r["tokenizer"], r["shape"]) for r in runs] == [("text", "fresh"), ("text", "continue")]
    for r in runs:
        assert r["direct"]["completed"] == r["proxy"]["completed"] == 10
        assert r["direct"]["errors"] == r["proxy"]["errors"] == 0
        assert r["tokens"] > 60 and r["hash_ms_p50"] > 0 and r["proxy_cpu_ms_per_req"] > 0
        assert r["loop_lag"]["samples"] > 0  # the proxy reported its own loop lag
        for key in ("ttft_p50_ms", "ttft_p99_ms", "total_p50_ms", "total_p99_ms"):
            assert r["added_ms"][key] == pytest.approx(r["proxy"][key] - r["direct"][key])
