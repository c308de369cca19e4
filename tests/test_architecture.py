"""The boundaries of docs/ARCHITECTURE.md, checked: import-linter contracts, what an engine process
loads, module sizes, and README's layout against the tree."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("index", "middleware", "engines", "tools")
MAX_LINES = 400
PROXY_STACK = ("litellm", "faiss", "onnxruntime", "sentence_transformers", "middleware")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_import_contracts_hold() -> None:
    """pyproject.toml's [tool.importlinter] contracts, as `lint-imports` checks them."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


# kvgate's import graph, by grimp (import-linter's graph builder): every import, those inside functions
# and under TYPE_CHECKING included, as the contracts count them
IMPORT_GRAPH = """
import json, grimp
graph = grimp.build_graph("kvgate", cache_dir=None)
print(json.dumps({m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}))
"""


def _import_graph() -> dict[str, list[str]]:
    """Module → the kvgate modules it imports (kvgate/ holds links to the four packages, so grimp
    reads the checkout as it reads an installed kvgate)."""
    done = subprocess.run([sys.executable, "-c", IMPORT_GRAPH], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """One import cycle per strongly connected component of `graph` with more than one module (Tarjan,
    iterative), as the path a → b → ... → a. A package importing its own submodules is not an edge:
    an __init__ that re-exports them is how a package is built, not a cycle between modules."""
    edges = {m: [t for t in targets if t in graph and not t.startswith(m + ".")] for m, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                on_stack.add(target)
                work.append((target, iter(edges[target])))
            elif target in on_stack:
                low[node] = min(low[node], index[target])
    cycles = []
    for component in components:  # the shortest way from its first module back to it, inside the component
        start, members = component[0], set(component)
        parent: dict[str, str] = {}
        frontier = [start]
        while start not in parent:
            reached = []
            for module in frontier:
                for target in edges[module]:
                    if target in members and target not in parent:
                        parent[target] = module
                        reached.append(target)
            frontier = reached
        path = [start]
        while len(path) == 1 or path[-1] != start:
            path.append(parent[path[-1]])
        cycles.append(path[::-1])
    return cycles


def test_cycles_finds_a_cycle() -> None:
    graph = {"k.a": ["k.b"], "k.b": ["k.c"], "k.c": ["k.a", "k.d"], "k.d": [], "k": ["k.a"], "k.e": ["k"]}
    assert _cycles(graph) == [["k.a", "k.b", "k.c", "k.a"]]
    assert _cycles({"k": ["k.a"], "k.a": ["k"]}) == []  # a package over its own submodule


def test_no_import_cycles() -> None:
    """No two kvgate modules import each other, directly or through others: each module can be read,
    tested and loaded after the ones it imports."""
    cycles = _cycles(_import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" → ".join(cycle) for cycle in cycles)


def test_engine_imports_load_no_proxy_stack() -> None:
    done = _python(f"""
        import sys
        import kvgate.engines.api, kvgate.engines.demo, kvgate.engines.sim.server, kvgate.engines.sim.engine
        import kvgate.engines.replica.server, kvgate.engines.replica.engine, kvgate.engines.replica.model
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
        from kvgate.engines.sim.engine import SimEngine
        from kvgate.engines.sim.server import create_sim_app
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
        import kvgate.middleware.errors, kvgate.middleware.config
        print("litellm" in sys.modules, "kvgate.middleware.sdk.client" in sys.modules)
        from kvgate import Gateway  # the public name still resolves
        print(Gateway.__module__)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:2] == ["False False", "kvgate.middleware.sdk.client"]


def test_cli_loads_only_the_subcommand_it_runs() -> None:
    """`kvgate serve` loads no tool or engine; `kvgate replica` / `sim-replica` load no proxy stack."""
    done = _python("""
        import sys
        from kvgate.middleware.cli import build_parser
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


def test_no_module_over_the_line_limit() -> None:
    """One job per module: no module of the four packages past MAX_LINES lines."""
    long = [
        f"{path.relative_to(ROOT)} ({path.read_text().count(chr(10))} lines)"
        for path in _modules()
        if path.read_text().count("\n") > MAX_LINES
    ]
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def _layout_block() -> str:
    readme = (ROOT / "docs/ARCHITECTURE.md").read_text()
    section = readme.split("\n## Layout", 1)[1]
    return section.split("```", 2)[1]


def test_layout_matches_the_tree() -> None:
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


@pytest.mark.parametrize("doc", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))])
def test_docs_name_only_existing_paths(doc: str) -> None:
    """Paths like `index/responses/semantic.py` or `engines/replica/` in the docs exist."""
    text = (ROOT / doc).read_text()
    paths = set(re.findall(r"`((?:index|middleware|engines|tools|examples|docs|tests)/[A-Za-z0-9_./]*)`", text))
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{doc} names paths that do not exist: {missing}"


# Variables kvgate's libraries once set for the whole process; only an entry point may (middleware/cli.py,
# a `python -m` block), and middleware/litellm_env.py for the ones LiteLLM reads at import.
PROCESS_ENV = (
    "LITELLM_LOCAL_MODEL_COST_MAP",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "TOKENIZERS_PARALLELISM",
    "AIOHTTP_KEEPALIVE_TIMEOUT",
    "OMP_WAIT_POLICY",
)
ENV_OWNERS = {"middleware/cli.py", "middleware/litellm_env.py"}
MAIN_BLOCK = re.compile(r'^if __name__ == "__main__":', re.M)
SETS_ENV = re.compile(
    r"\b(?:os\.)?environ(?:\[[^\]]*\]\s*(?:\|)?=(?!=)|\.(?:setdefault|update|pop|popitem|clear)\s*\()"
    r"|\b(?:os\.)?(?:putenv|unsetenv)\s*\(|\bdel\s+(?:os\.)?environ\["
)


def test_library_imports_leave_the_environment_alone() -> None:
    """Importing the libraries (and the calls that once set offline switches) changes no variable:
    a host process that embeds kvgate keeps the environment it chose."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in PROCESS_ENV}
    code = textwrap.dedent("""
        import os
        before = dict(os.environ)
        import middleware, kvgate.middleware.config, kvgate.index.kv.tokenizer, kvgate.index.responses.embedder, engines, kvgate.engines.replica.model
        kvgate.index.responses.embedder.packaged_minilm_path()
        kvgate.index.kv.tokenizer.load_tokenizer("text")
        after = dict(os.environ)
        print(sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k)))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_litellm_env_sets_only_its_import_switches() -> None:
    """kvgate.middleware.litellm_env sets LiteLLM's import-time variables as defaults: an operator's value wins."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in PROCESS_ENV}
    env["AIOHTTP_KEEPALIVE_TIMEOUT"] = "7"
    code = textwrap.dedent("""
        import os
        before = dict(os.environ)
        from kvgate.middleware.litellm_env import litellm
        from litellm.constants import AIOHTTP_KEEPALIVE_TIMEOUT
        after = dict(os.environ)
        print(sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k)))
        print(after["AIOHTTP_KEEPALIVE_TIMEOUT"], AIOHTTP_KEEPALIVE_TIMEOUT, litellm.suppress_debug_info)
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-2:] == ["['LITELLM_LOCAL_MODEL_COST_MAP']", "7 7 True"]


def test_cli_sets_the_process_defaults() -> None:
    """The entry point sets the process-wide defaults before a subcommand imports anything heavy,
    OMP_WAIT_POLICY only for `kvgate tune`; an operator's own value wins."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in PROCESS_ENV}
    env["TOKENIZERS_PARALLELISM"] = "true"
    code = textwrap.dedent("""
        import os
        from kvgate.middleware.cli import set_process_env
        set_process_env(["-v", "serve", "--config", "x.yaml"])
        print(os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"),
              os.environ.get("TOKENIZERS_PARALLELISM"), os.environ.get("OMP_WAIT_POLICY"))
        set_process_env(["tune", "--pairs", "p.csv"])
        print(os.environ.get("OMP_WAIT_POLICY"))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-2:] == ["1 1 true None", "PASSIVE"]


def test_only_entry_points_set_the_environment() -> None:
    """No library module assigns os.environ: only middleware/cli.py, middleware/litellm_env.py and
    `if __name__ == "__main__":` blocks (a process of their own) may."""
    offenders = []
    for path in _modules():
        rel = str(path.relative_to(ROOT))
        if rel in ENV_OWNERS:
            continue
        library_part = MAIN_BLOCK.split(path.read_text(), 1)[0]
        for number, line in enumerate(library_part.splitlines(), 1):
            if SETS_ENV.search(line.split("#", 1)[0]):
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert not offenders, "library modules that set environment variables:\n" + "\n".join(offenders)


def test_litellm_is_imported_through_litellm_env() -> None:
    """LiteLLM reads its switches at import, so whichever module imports it first must have
    imported kvgate.middleware.litellm_env before: every other module's first litellm import follows it."""
    first_import = re.compile(r"^\s*(?:import litellm\b|from litellm[. ])", re.M)
    offenders = []
    for path in _modules():
        rel = str(path.relative_to(ROOT))
        if rel == "middleware/litellm_env.py":
            continue
        text = path.read_text()
        found = first_import.search(text)
        if found and "from kvgate.middleware.litellm_env import litellm" not in text[: found.start()]:
            offenders.append(f"{rel}:{text.count(chr(10), 0, found.start()) + 1}")
    assert not offenders, f"modules importing LiteLLM before kvgate.middleware.litellm_env: {offenders}"


HISTORY = re.compile(r"[Ii]ssue [0-9]+|BENCHMARKS\.md issue")


def test_comments_cite_no_issue_numbers() -> None:
    """Comments say why, never history: no issue numbers or benchmark-log entries in the code."""
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in _modules()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, "code citing issues instead of reasons:\n" + "\n".join(found)
