"""`kvgate tune --embedder` / `--split`, `embedder.model_path` through the real pipeline, the
refusal of mixed vectors, and `kvgate bench trust --train-pairs` on tiny data (a few training
batches: seconds, not a real tuning)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kvgate.index.responses.embedder import MANIFEST, embedder_identity, make_embedder, packaged_minilm_path
from kvgate.index.responses.embedder_onnx import _fingerprint
from kvgate.index.storage.env import model_cache_dir
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.cli import main as cli_main
from kvgate.middleware.config import parse_config
from kvgate.middleware.errors import ConfigError
from kvgate.tools.tuning.embedder_train import precision_at_recall, scores_at
from kvgate.tools.tuning.pairs import read_pairs
from kvgate.tools.tuning.split import normalise
from kvgate.tools.tuning.split_files import split_pairs

TOPICS = [
    "Python",
    "Java",
    "guitar",
    "chess",
    "French",
    "calculus",
    "painting",
    "swimming",
    "cooking",
    "Rust",
    "piano",
    "knitting",
    "German",
    "statistics",
    "photography",
    "running",
    "yoga",
    "poker",
    "Go",
    "drawing",
]


def write_pairs(path: Path) -> Path:
    rows = ["question1,question2,is_duplicate"]
    for t in TOPICS:
        rows += [
            f"How do I learn {t} quickly?,What is the fastest way to learn {t}?,1",
            f"How do I learn {t} quickly?,How do I teach {t} quickly?,0",
            f"Is {t} hard to learn?,How difficult is it to learn {t}?,1",
            f"Is {t} hard to learn?,Is {t} hard to forget?,0",
        ]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory):
    """A model cache of the module's own (nothing tiny lands in the user's), holding the packaged
    MiniLM's export from the real cache when there is one (saves re-exporting it)."""
    real = model_cache_dir()
    cache = tmp_path_factory.mktemp("models")
    export = real / f"minilm-{_fingerprint(packaged_minilm_path())}.onnx"
    if export.exists():
        (cache / export.name).symlink_to(export)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVGATE_MODEL_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="module")
def tuned(model_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("tune")
    pairs = write_pairs(tmp / "pairs.csv")
    out = tmp / "tuned"
    assert (
        cli_main(
            [
                "tune",
                "--embedder",
                "--pairs",
                str(pairs),
                "--out-dir",
                str(out),
                "--max-steps",
                "2",
                "--json",
                str(tmp / "report.json"),
            ]
        )
        == 0
    )
    return out


def test_tune_embedder_writes_a_model_dir_with_its_manifest(tuned: Path, capsys):
    manifest = json.loads((tuned / MANIFEST).read_text())
    assert manifest["identity"].startswith("tuned:") and manifest["dim"] == 384
    assert manifest["training"]["steps"] == 2 and manifest["tuning_seconds"] > 0
    for side in ("holdout_before", "holdout_after"):
        assert set(manifest[side]) == {"precision_at_recall_0.90", "threshold_at_recall_0.90", "at_default_threshold"}
    assert manifest["split"]["seed"] and manifest["split"]["holdout"]["pairs"] > 0
    assert len(manifest["calibration"]["coef"]) == 2
    # the same data again: reused, not retrained
    pairs = Path(manifest["pairs_file"])
    assert cli_main(["tune", "--embedder", "--pairs", str(pairs), "--out-dir", str(tuned), "--max-steps", "2"]) == 0
    assert "reusing the tuned embedder" in capsys.readouterr().err


def test_the_tuned_dir_serves_through_the_pipeline_config_and_mixed_vectors_are_refused(
    tuned: Path, backend, tmp_path: Path
):
    def config(model_path: str | None):
        return parse_config(
            {
                "cache_dir": str(tmp_path / "cache"),
                "embedder": {"model_path": model_path},
                "routes": [
                    {
                        "name": "chat",
                        "model": "demo-*",
                        "semantic": {"threshold": 0.9},
                        "backend": {"model": "openai/x", "api_base": backend.api_base, "api_key": "sk-x"},
                    }
                ],
            }
        )

    pipeline = build_pipeline(config(str(tuned)))  # the embedder comes from embedder.model_path
    try:
        first = pipeline.complete(
            {"model": "demo-1", "messages": [{"role": "user", "content": "How do I learn chess?"}]}
        )
        again = pipeline.complete(
            {"model": "demo-1", "messages": [{"role": "user", "content": "How do I learn chess?"}]}
        )
        assert first.info.cache == "miss" and again.info.cache != "miss"
    finally:
        pipeline.close()
    vectors = make_embedder("onnx", tuned).embed(["How do I learn chess?"])
    assert vectors.shape == (1, 384) and abs(float(np.linalg.norm(vectors[0])) - 1) < 1e-4
    assert (tmp_path / "cache" / "embedder.id").read_text().strip() == json.loads((tuned / MANIFEST).read_text())[
        "identity"
    ]
    with pytest.raises(ConfigError) as err:  # the packaged MiniLM on the tuned model's vectors
        build_pipeline(config(None))
    assert "embedder.model_path" in err.value.message and "fresh cache_dir" in err.value.message


def test_mixed_vectors_are_refused_on_redis_too(embedder, backend, redis_server, tmp_path: Path):
    raw = {
        "cache_dir": str(tmp_path / "cache"),
        "store": {"backend": "redis", "url": redis_server.url},
        "routes": [
            {
                "name": "chat",
                "model": "demo-*",
                "semantic": {"threshold": 0.9},
                "backend": {"model": "openai/x", "api_base": backend.api_base, "api_key": "sk-x"},
            }
        ],
    }

    class Other:
        name, dim, identity = embedder.name, embedder.dim, "another-model:1"

        def embed(self, texts):
            return embedder.embed(texts)

    build_pipeline(parse_config(raw), embedder=embedder).close()
    build_pipeline(parse_config(raw), embedder=embedder).close()  # the same embedder: fine
    with pytest.raises(ConfigError) as err:
        build_pipeline(parse_config(raw), embedder=Other())
    assert "embedder.model_path" in err.value.message and embedder_identity(embedder) in err.value.message


def test_split_files_share_no_question(tmp_path: Path):
    pairs = write_pairs(tmp_path / "pairs.csv")
    assert (
        cli_main(
            ["tune", "--split", "--pairs", str(pairs), "--out-dir", str(tmp_path / "out"), "--eval-fraction", "0.5"]
        )
        == 0
    )
    train, _ = read_pairs(tmp_path / "out" / "pairs_train.csv")
    evaluation, _ = read_pairs(tmp_path / "out" / "pairs_eval.csv")
    assert len(train) + len(evaluation) == 4 * len(TOPICS) and train and evaluation

    def questions(ps):
        return {normalise(q) for p in ps for q in (p.question1, p.question2)}

    assert not questions(train) & questions(evaluation)
    assert split_pairs(read_pairs(pairs)[0], 0.5) == (train, evaluation)  # deterministic
    # the train file splits again into train / calib / holdout (its own seed: not all "train")
    from kvgate.tools.tuning.split import assign_parts

    assert len(set(assign_parts([(p.question1, p.question2) for p in train]))) > 1


def test_precision_at_recall():
    scores = np.array([0.99, 0.95, 0.9, 0.8, 0.7, 0.6])
    labels = np.array([1, 0, 1, 1, 0, 1], dtype=bool)
    assert precision_at_recall(scores, labels, 0.5) == (2 / 3, 0.9)
    assert precision_at_recall(scores, labels, 0.9) == (4 / 6, 0.6)
    assert precision_at_recall(scores, np.zeros(6, dtype=bool), 0.9) == (None, None)
    assert scores_at(scores, labels, 0.9) == {"threshold": 0.9, "precision": 0.6667, "recall": 0.5}


def test_bench_trust_trains_on_train_pairs_and_reports_minilm_beside(model_cache: Path, tmp_path: Path):
    pairs = write_pairs(tmp_path / "pairs.csv")
    assert cli_main(["tune", "--split", "--pairs", str(pairs), "--out-dir", str(tmp_path)]) == 0
    out = tmp_path / "trust.json"
    assert (
        cli_main(
            [
                "bench",
                "trust",
                "--pairs",
                str(tmp_path / "pairs_eval.csv"),
                "--train-pairs",
                str(tmp_path / "pairs_train.csv"),
                "--thresholds",
                "0.9",
                "--max-error-rate",
                "0.05",
                "--tune-max-steps",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert set(result) >= {
        "static",
        "best_static_within",
        "verified",
        "ceiling",
        "embedder",
        "minilm_static",
        "minilm_best_static_within",
        "tuning_seconds",
    }
    assert result["slice"] == "all" and result["embedder"]["shared_questions_with_eval"] == 0
    assert result["embedder"]["dir"].startswith(str(model_cache))
    assert len(result["static"]) == len(result["minilm_static"]) == 1
    assert "repeat_rate" in result["ceiling"]
    shutil.rmtree(result["embedder"]["dir"])


@pytest.mark.parametrize("use_prior", [True, False])
def test_max_error_rate_routes_take_the_tuned_models_calibration_as_prior(
    tuned: Path, backend, tmp_path: Path, use_prior: bool
):
    config = parse_config(
        {
            "cache_dir": str(tmp_path / "cache"),
            "embedder": {"model_path": str(tuned), "calibration_prior": use_prior},
            "routes": [
                {
                    "name": "chat",
                    "model": "demo-*",
                    "semantic": {"max_error_rate": 0.05},
                    "backend": {"model": "openai/x", "api_base": backend.api_base, "api_key": "sk-x"},
                }
            ],
        }
    )
    pipeline = build_pipeline(config)
    try:
        prior = pipeline.trust.prior
        calibration = json.loads((tuned / MANIFEST).read_text())["calibration"]
        assert (prior is not None and list(prior.coef) == calibration["coef"]) if use_prior else prior is None
    finally:
        pipeline.close()
