"""Style is checked, not hoped for: ruff's lint rules and its formatter, as pyproject.toml sets them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).with_name("ruff")  # installed by the dev extra (make install)


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RUFF), *args, "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=180)


def test_lint_rules_hold() -> None:
    done = _ruff("check")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_code_is_formatted() -> None:
    done = _ruff("format", "--check")
    assert done.returncode == 0, "run `ruff format .`:\n" + done.stdout[-4000:] + done.stderr[-2000:]
