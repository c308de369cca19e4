"""The release as a user meets it (.ci/release-check): the wheel built from the sdist holds one
top-level package; its core install has no torch and serves a miss, then a hit, on the demo
backend; the connector goes into vLLM's environment with one command, changing nothing of vLLM's,
and an engine starts with it. A few minutes: it installs the core from the package index."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvgate.engines.vllm.launch import vllm_available, vllm_python

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_the_release_installs_and_runs_as_documented(tmp_path):
    if not vllm_available():
        pytest.fail(f"vLLM's environment is missing ({vllm_python()}): run `make install`")
    report = tmp_path / "release.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "release-check"), "--json", str(report), "--keep", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(report.read_text())
    assert found["wheel"]["top_level"] == ["kvgate", "kvgate-0.1.0.dist-info"]
    assert found["core"]["prefix_loops"] == "kvgate.index.kv._prefix_loops"  # the C loops, built and used
    assert found["core"]["hash_loops"] == "kvgate.index.kv._hash_loops"
    assert found["core"]["sse_take"] == "kvgate.middleware.forward._sse_take"
    assert found["core"]["serve"]["cache"] == ["miss", "exact"]
    assert found["core"]["serve"]["health"]["semantic"] is False
    assert "pip install 'kvgate[embedder]'" in found["core"]["serve"]["semantic_by_name_refused"]
    assert "kvgate" in found["vllm"]["added_packages"]
    assert not {"litellm", "faiss-cpu", "onnxruntime", "fastapi"} & set(found["vllm"]["added_packages"])
    assert found["vllm"]["engine"]["prompt_tokens"] > 0


def test_the_connector_command_names_the_vllm_extra():
    """The one command of the docs and the Makefile installs what the `vllm` extra lists."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    names = {r.split("[")[0].split(">")[0].split("=")[0].strip() for r in extra}
    command = "pip install --no-deps kvgate xxhash zstandard diskcache redis hiredis cryptography cffi pycparser"
    assert names <= set(command.split()), names
    for doc in ("README.md", "docs/kv-connector.md"):
        assert command in (ROOT / doc).read_text(), doc
    assert (
        "pip install -q --no-deps -e . xxhash zstandard diskcache redis hiredis cryptography cffi pycparser"
        in (ROOT / "Makefile").read_text()
    )
    script = (ROOT / ".ci" / "release-check").read_text()
    packages = ", ".join(f'"{name}"' for name in command.split()[4:])
    assert f"CONNECTOR_PACKAGES = ({packages})" in script
