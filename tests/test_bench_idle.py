"""`kvgate bench idle` (tools/bench/idle.py): a real proxy in front of a demo backend, measured idle."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from kvgate.tools.bench.idle import add_arguments, main, run
from tests.conftest import ROOT


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_one_short_window_of_the_installed_code(tmp_path):
    out = tmp_path / "idle.json"
    assert main(_args("--seconds", "1", "--replicas", "1", "--rounds", "1", "--json", str(out))) == 0
    result = json.loads(out.read_text())
    (window,) = result["windows"]
    assert window["tree"] == "installed" and window["seconds"] >= 1.0
    assert window["cpu_ms_per_s"] > 0  # the process lives: something ran, if only the tick
    assert window["wakeups_per_s"] >= 0
    assert set(result["summary"]) == {"installed"}


def test_a_tree_without_the_package_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="holds no kvgate/"):
        run(_args("--trees", str(tmp_path), "--seconds", "1"))


def test_bad_numbers_are_refused():
    run_ = subprocess.run(
        [sys.executable, "-m", "kvgate.middleware.cli", "bench", "idle", "--seconds", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run_.returncode == 2 and "must be positive" in run_.stdout
