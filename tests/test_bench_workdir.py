"""A bench's work directory after its run: logs, configs and results stay, the stores go."""

from pathlib import Path

from kvgate.tools.bench.workdir import tidy


def test_tidy_keeps_logs_configs_and_results_and_removes_the_stores(tmp_path: Path) -> None:
    (tmp_path / "cache-text" / "ab").mkdir(parents=True)
    (tmp_path / "cache-text" / "cache.db").write_bytes(b"x" * 1000)
    (tmp_path / "cache-text" / "ab" / "cd.val").write_bytes(b"y" * 24)
    (tmp_path / "tier-int8" / "deep").mkdir(parents=True)
    (tmp_path / "tier-int8" / "deep" / "chunk").write_bytes(b"z" * 100)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "proxy.log").write_text("served\n")
    (tmp_path / "text.yaml").write_text("routes: []\n")
    (tmp_path / "cache-text" / "stats.json").write_text("{}")

    assert tidy(tmp_path) == 1124

    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert left == ["cache-text", "cache-text/stats.json", "logs", "logs/proxy.log", "text.yaml"]
    assert tmp_path.exists()
    assert tidy(tmp_path) == 0  # nothing left to free
