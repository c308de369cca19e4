"""The boundaries of docs/ARCHITECTURE.md, checked: import-linter contracts, what an engine process
loads, module sizes, and README's layout against the tree."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("index", "middleware", "engines", "tools")
MAX_LINES = 400
LONG_REASON = "Long module:"  # a module past MAX_LINES says why at its top, after this marker
PROXY_STACK = ("litellm", "faiss", "onnxruntime", "sentence_transformers", "middleware")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_import_contracts_hold() -> None:
    """pyproject.toml's [tool.importlinter] contracts, as `lint-imports` checks them."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_engine_imports_load_no_proxy_stack() -> None:
    done = _python(f"""
        import sys
        import engines.api, engines.demo, engines.sim.server, engines.sim.engine
        import engines.replica.server, engines.replica.engine, engines.replica.model
        print(sorted(m for m in {PROXY_STACK!r} if m in sys.modules))
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def test_sim_replica_serves_with_the_proxy_stack_absent() -> None:
    """Not just unimported: a sim replica answers a chat request where LiteLLM, FAISS and the ONNX
    runtime cannot be imported at all (a machine that installed only what the engines need)."""
    done = _python(f"""
        import importlib.abc, sys

        class Absent(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {PROXY_STACK!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)")
                return None

        sys.meta_path.insert(0, Absent())
        from fastapi.testclient import TestClient
        from engines.sim.engine import SimEngine
        from engines.sim.server import create_sim_app
        client = TestClient(create_sim_app(SimEngine(4096, prefill_tps=1e6, decode_tps=1e6), name="s1"))
        reply = client.post("/v1/chat/completions", json={{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]}})
        print(reply.status_code, reply.json()["choices"][0]["message"]["content"].split()[0])
        bad = client.post("/v1/chat/completions", json={{"model": "m", "messages": []}})
        print(bad.status_code, bad.json()["error"]["param"])
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["200 [s1]", "400 messages"]


def test_core_submodules_load_lazily() -> None:
    """Importing a small core module (errors, config) loads neither the SDK nor LiteLLM."""
    done = _python("""
        import sys
        import middleware.errors, middleware.config
        print("litellm" in sys.modules, "middleware.client" in sys.modules)
        from middleware import Gateway  # the public name still resolves
        print(Gateway.__module__)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["False False", "middleware.client"]


def test_cli_loads_only_the_subcommand_it_runs() -> None:
    """`kvgate serve` loads no tool or engine; `kvgate replica` / `sim-replica` load no proxy stack."""
    done = _python("""
        import sys
        from middleware.cli import build_parser
        build_parser(["serve", "--config", "x.yaml"])
        print(sorted({m.split(".")[0] for m in sys.modules if m.startswith(("tools", "engines"))}))
        build_parser(["replica", "--port", "1"])
        build_parser(["sim-replica", "--port", "1"])
        print(sorted(m for m in ("litellm", "faiss", "onnxruntime", "tools") if m in sys.modules))
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["[]", "[]"]
def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_no_long_module_without_a_reason() -> None:
    """One job per module: past MAX_LINES lines a module says why at its top."""
    long = []
    for path in _modules():
        text = path.read_text()
        if text.count("\n") > MAX_LINES and LONG_REASON not in text[:3000]:
            long.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not long, f"modules over {MAX_LINES} lines with no '{LONG_REASON}' note at the top: {long}"


def _layout_block() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Layout", 1)[1]
    return section.split("```", 2)[1]


def test_readme_layout_matches_the_tree() -> None:
    """Every module of the four packages is named in README's layout block, and every name there
    exists: `folder/` headings, then `name.py` (or `sub/name.py`) entries; an indented `sub/ `
    opens a sub-folder for the entries after it."""
    block = _layout_block()
    named: set[str] = set()
    folder, sub = None, ""
    for line in block.splitlines():
        head = re.match(r"^([a-z_]+/)", line)
        if head:
            folder, sub = head.group(1), ""
        inner = re.match(r"^\s+([a-z_]+/)\s", line)  # an indented `bench/ (...)`: names below are inside it
        if inner:
            sub = inner.group(1)
        if folder and folder.rstrip("/") in PACKAGES:
            for name in re.findall(r"\b((?:[a-z_]+/)*[a-z_0-9]+\.py)\b", line):
                named.add(folder + sub + name)
    actual = {str(p.relative_to(ROOT)) for p in _modules() if p.name != "__init__.py"}
    assert sorted(actual - named) == [], "modules missing from README's layout"
    assert sorted(named - actual) == [], "README's layout names modules that do not exist"


@pytest.mark.parametrize("doc", ["README.md", "docs/ARCHITECTURE.md"])
def test_docs_name_only_existing_paths(doc: str) -> None:
    """Paths like `index/semantic.py` or `engines/replica/` in the docs exist."""
    text = (ROOT / doc).read_text()
    paths = set(re.findall(r"`((?:index|middleware|engines|tools|examples|docs|tests)/[A-Za-z0-9_./]*)`", text))
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{doc} names paths that do not exist: {missing}"
