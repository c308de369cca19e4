"""kvgate.middleware.progress: a bar on a terminal, plain lines in logs; and `kvgate bench plot`."""

from __future__ import annotations

import io
import json
from pathlib import Path

from kvgate.middleware.cli import main
from kvgate.middleware.progress import Progress, progress, say


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    assert list(progress(range(5), "work", unit="items", stream=out, every_s=0)) == [0, 1, 2, 3, 4]
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[work] 1/5 items (20%)") and "\r" not in out.getvalue()
    assert lines[-1].startswith("[work] 5/5 items (100%) done in")
    assert len(lines) == 5  # 4 periodic lines + the final one, never two for the last step


def test_lines_are_rate_limited_and_carry_the_note() -> None:
    out = io.StringIO()
    with Progress(None, "train", stream=out, every_s=3600) as bar:
        for _ in range(100):
            bar.update(note="loss 0.5")
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[0]]  # only the final line
    assert out.getvalue().startswith("[train] 100 it done in") and out.getvalue().rstrip().endswith("loss 0.5")


def test_a_bar_on_a_terminal_and_say_keeps_it() -> None:
    term = Terminal()
    with Progress(3, "bench", unit="steps", stream=term) as bar:
        say("bench", term)("halfway")
        bar.update(3)
    text = term.getvalue()
    assert "\r" in text and "3/3" in text and "[bench] halfway" in text


def test_bench_plot_draws_saved_results_and_names_a_wrong_file(tmp_path: Path) -> None:
    semantic = {
        "pairs": 10,
        "sweep": [{"threshold": t, "precision": 0.5 + t / 4, "recall": 1 - t, "hits": 3} for t in (0.7, 0.8, 0.9)],
        "gptcache": {"threshold": 0.8, "precision": 0.7, "recall": 0.2},
    }
    routing = {
        "scenario": "tiny",
        "requests": 3,
        "policies": {
            "cache_aware": {"router": "kvgate cache_aware", "ttft_p99_s": 0.3, "ttfts_s": [0.1, 0.2, 0.3]},
            "sglang": {"skipped": "not installed"},
        },
    }
    kv = {
        "history_tokens": 2000,
        "repeats": 3,
        "modes": {
            m: {"ttft_s": t, "load_s": load, "prefill_s": p}
            for m, t, load, p in (("cold", 4.0, 0.0, 3.9), ("warm_ram", 0.2, 0.07, 0.1), ("warm_disk", 0.3, 0.2, 0.08))
        },
    }
    for kind, result in (("semantic", semantic), ("routing", routing), ("kv", kv)):
        src, png = tmp_path / f"{kind}.json", tmp_path / f"{kind}.png"
        src.write_text(json.dumps(result))
        assert main(["bench", "plot", kind, str(src), "--out", str(png)]) == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 100_000
    no_ttfts = tmp_path / "old.json"
    no_ttfts.write_text(json.dumps({"policies": {"cache_aware": {"ttft_p99_s": 1.0}}}))
    assert main(["bench", "plot", "routing", str(no_ttfts), "--out", str(tmp_path / "x.png")]) == 2
    assert main(["bench", "plot", "kv", str(tmp_path / "missing.json"), "--out", str(tmp_path / "y.png")]) == 2
    assert not (tmp_path / "x.png").exists()
