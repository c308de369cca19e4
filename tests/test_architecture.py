"""The boundaries of docs/ARCHITECTURE.md, checked: import-linter contracts, what an engine process
loads, module sizes, and README's layout against the tree."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

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
