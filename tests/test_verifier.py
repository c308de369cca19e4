"""The verification stage: split, synthetic edits, the choice rule, the trained verifier, `kvgate tune`,
the pipeline loading a tuned point, and a proxy that refuses a near-duplicate-but-different hit.

The verifier is the one `make tune` trained (`kvgate tune`) when it exists; without it, and for the
tests that need to know what it was taught, a session fixture trains a small one on the hand-written
paraphrases here (about 45 s on 2 cores).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import route_config

from kvgate.index.responses.verifier import Verifier, default_verifier_dir, load_verifier
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.cache.operating_point import operating_point_path, read_operating_point
from kvgate.middleware.cache.verification import SemanticSettings, choose, to_verify
from kvgate.middleware.cli import main
from kvgate.middleware.config import parse_config
from kvgate.middleware.errors import ConfigError
from kvgate.tools.bench.proxy_latency import SEED_QUESTIONS
from kvgate.tools.tuning.split import assign_parts, group_keys
from kvgate.tools.tuning.synthetic import edit_negation, edit_number, edit_roles, edit_unit, hard_negatives

# (cached question, new question): each asks something else, though the embedding puts them close
DIFFERENT = [
    ("How can I lose weight in a week?", "How can I lose weight in a month?"),  # time span
    ("What is the best laptop under 500 dollars?", "What is the best laptop under 1000 dollars?"),  # number
    ("Who won the FIFA World Cup in 2014?", "Who won the FIFA World Cup in 2018?"),  # date
    ("What is the capital of France?", "What is the capital of Germany?"),  # entity
    ("Why do people like Donald Trump?", "Why do people not like Donald Trump?"),  # negation
    ("Is Python faster than Java?", "Is Java faster than Python?"),  # swapped roles
    ("How do I convert US dollars to euros?", "How do I convert euros to US dollars?"),  # swapped roles
    ("What are the advantages of nuclear energy?", "What are the disadvantages of nuclear energy?"),  # comparative
    ("Which is the best phone under 20000 rupees?", "Which is the worst phone under 20000 rupees?"),  # comparative
]
SAME = [
    ("How can I lose weight quickly?", "What is the fastest way to lose weight?"),
    ("What is the capital of France?", "Which city is the capital of France?"),
    ("How do I learn Python?", "What is the best way to learn Python?"),
    ("How do I improve my spoken English?", "How can I improve my English speaking skills?"),
] + [(seed, para) for seed, para, _ in SEED_QUESTIONS[:6]]


def _tiny_rows() -> list[tuple[str, str, bool]]:
    """Labelled pairs from the benchmark's hand-written paraphrases, with edited copies as negatives.
    Every question1 is distinct, so in the cache setting a lookup's own entry is the only right one."""
    rows: list[tuple[str, str, bool]] = [(seed, p1, True) for seed, p1, _ in SEED_QUESTIONS]
    rows += [(p2, edited, False) for p2, edited, _ in hard_negatives([p2 for _, _, p2 in SEED_QUESTIONS])]
    return rows


@pytest.fixture(scope="session")
def tiny_verifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A verifier trained here on `_tiny_rows` (20 epochs of 77 pairs: ~45 s on 2 cores), so
    tests know what it was taught."""
    from kvgate.tools.tuning.train import TrainConfig
    from kvgate.tools.tuning.tune_run import ensure_verifier

    target = tmp_path_factory.mktemp("verifier") / "small"
    ensure_verifier(target, _tiny_rows(), [], TrainConfig(epochs=20, max_examples=800), retrain=True)
    return target


@pytest.fixture(scope="session")
def verifier_dir(request: pytest.FixtureRequest) -> Path:
    """The verifier `make tune` trained when there is one, else the tiny one."""
    made = default_verifier_dir()
    if (made / "model.onnx").is_file():
        return made
    return request.getfixturevalue("tiny_verifier_dir")


@pytest.fixture(scope="session")
def tiny_verifier(tiny_verifier_dir: Path) -> Verifier:
    return load_verifier(tiny_verifier_dir)


# ------------------------------------------------------------------------------------------ pure parts
def test_split_is_deterministic_and_grouped() -> None:
    pairs = [("What is AI?", "what is ai"), ("What is AI", "Define AI"), ("How tall is K2?", "K2 height?")]
    pairs += [(f"question {i}", f"other {i}") for i in range(200)]
    parts = assign_parts(pairs)
    assert parts == assign_parts(list(pairs))  # same input, same parts
    assert parts[0] == parts[1]  # "What is AI?" links the first two pairs
    assert group_keys(pairs)[0] == group_keys(pairs)[1]
    assert {"train", "calib", "holdout"} <= set(parts)
    shuffled = list(reversed(pairs))
    assert list(reversed(assign_parts(shuffled))) == parts  # file order does not matter


def test_synthetic_edits_change_what_is_asked() -> None:
    assert edit_unit("How can I lose weight in a week?") == "How can I lose weight in a month?"
    assert edit_roles("Is Python faster than Java?") == "Is Java faster than Python?"
    assert edit_roles("How do I go from Delhi to Mumbai?") == "How do I go from Mumbai to Delhi?"
    assert edit_negation("Why can't I sleep?") == "Why can I sleep?"
    changed = edit_number("Who are the 10 greatest players?")
    assert changed is not None and "10" not in changed


def test_choose_serves_only_what_passes_both_thresholds() -> None:
    s = SemanticSettings(threshold=0.8, verifier_threshold=0.6, candidates=3, source="test")
    sims, floors = [0.95, 0.9, 0.7], [0.8, 0.8, 0.8]
    assert to_verify(sims, floors, s) == [0, 1]  # the third is under the cosine threshold
    assert choose(sims, floors, {0: 0.2, 1: 0.9}, s) == 1  # the verifier prefers the second
    assert choose(sims, floors, {0: 0.5, 1: 0.59}, s) is None  # both rejected
    assert choose(sims, [0.99, 0.8, 0.8], {1: 0.7}, s) == 1  # a raised floor (feedback) removes the first
    plain = SemanticSettings(0.8, None, 1, "test")
    assert choose(sims, floors, {}, plain) == 0 and choose([0.7], [0.8], {}, plain) is None


def test_calibration_picks_the_best_recall_that_meets_the_target() -> None:
    import numpy as np

    from kvgate.tools.tuning.calibrate import Candidates, pick, sweep

    # 4 lookups, top-2 each; lookups 0-2 are duplicates. Lookup 1's own entry is second by cosine but
    # first by verifier score; lookup 3 (not a duplicate) has a high cosine but a low verifier score.
    c = Candidates(
        entry=np.array([[0, 5], [7, 1], [2, 6], [3, 4]]),
        cosine=np.array([[0.95, 0.5], [0.93, 0.92], [0.7, 0.6], [0.99, 0.2]], dtype=np.float32),
        prob=np.array([[0.9, 0.1], [0.2, 0.8], [0.95, 0.1], [0.3, np.nan]], dtype=np.float32),
        duplicate=np.array([True, True, True, False]),
    )
    # cosine alone: the non-duplicate's 0.99 is top of every threshold, so 0.99 precision is out of reach
    assert pick(sweep(c, [0.9, 0.94], with_verifier=False), target=0.99, min_hits=1) is None
    cosine_only = pick(sweep(c, [0.9, 0.94], with_verifier=False), target=0.5, min_hits=1)
    assert cosine_only is not None and (cosine_only.cosine_threshold, cosine_only.hits) == (0.94, 2)
    best = pick(sweep(c, [0.65, 0.9]), target=0.99, min_hits=1)
    assert best is not None and (best.cosine_threshold, best.correct_hits, best.hits) == (0.65, 3, 3)
    assert best.verifier_threshold is not None and 0.3 < best.verifier_threshold <= 0.8
    assert pick(sweep(c, [0.65]), target=0.99, min_hits=4) is None  # never 4 hits at that precision


# ------------------------------------------------------------------------------------------ the model
def test_trained_verifier_separates_what_it_was_taught(tiny_verifier: Verifier) -> None:
    """Training and the ONNX export keep what the examples teach: on its own training pairs
    (paraphrases, and edits that change what is asked: negation, best/worst, units) every
    paraphrase scores above every edit. How well a verifier generalises is measured on Quora
    pairs in docs/BENCHMARKS.md (issue 5), not asserted here: a model trained in a test on 77
    pairs does not (e.g. it scores "Is Java faster than Python?" between two paraphrases of
    "Is Python faster than Java?")."""
    rows = _tiny_rows()
    scores = tiny_verifier.score([(a, b) for a, b, _ in rows])
    assert ((0 <= scores) & (scores <= 1)).all()
    positive = [float(x) for x, (_, _, same) in zip(scores, rows) if same]
    negative = [float(x) for x, (_, _, same) in zip(scores, rows) if not same]
    assert len(positive) >= 20 and len(negative) >= 20  # both kinds, enough of each to mean something
    assert min(positive) > max(negative), (min(positive), max(negative))
    assert max(negative) < 0.5 < min(positive)  # the default verifier_threshold cuts them apart


# ------------------------------------------------------------------------------------------ tune → pipeline
def _write_pairs(path: Path) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["question1", "question2", "is_duplicate"])
        writer.writerows((a, b, int(d)) for a, b, d in _tiny_rows())


def _config(tmp_path: Path, verifier_dir: Path, **semantic: Any) -> dict[str, Any]:
    raw = route_config("http://127.0.0.1:9/v1", tmp_path / "cache", **semantic)
    raw["embedder"] = {"verifier_path": str(verifier_dir)}
    return raw


def test_tune_writes_a_point_the_pipeline_loads(tmp_path: Path, verifier_dir: Path, embedder: Any) -> None:
    pairs = tmp_path / "pairs.csv"
    _write_pairs(pairs)
    raw = _config(tmp_path, verifier_dir)
    raw["routes"][0]["semantic"] = {"target_precision": 0.7}
    config_file = tmp_path / "kvgate.yaml"
    config_file.write_text(json.dumps(raw))  # JSON is YAML
    config = parse_config(raw)
    with pytest.raises(ConfigError, match=r"routes\.0\.semantic\.target_precision.*kvgate tune"):
        build_pipeline(config, embedder=embedder)  # no tuned point yet: start-up names the field and the command

    report_file = tmp_path / "report.json"
    assert (
        main(
            [
                "tune",
                "--pairs",
                str(pairs),
                "--route",
                "chat",
                "--config",
                str(config_file),
                "--verifier-dir",
                str(verifier_dir),
                "--min-hits",
                "3",
                "--json",
                str(report_file),
            ]
        )
        == 0
    )
    point = read_operating_point(tmp_path / "cache", "chat")
    assert point is not None and point.target_precision == 0.7
    assert point.expected_precision >= 0.7 and 0 < point.expected_recall <= 1
    assert point.calibration["pairs"] > 0 and point.calibration["pairs_file"] == str(pairs)
    report = json.loads(report_file.read_text())
    assert report["written"] == str(operating_point_path(tmp_path / "cache", "chat"))

    pipeline = build_pipeline(config, embedder=embedder)
    try:
        settings = pipeline.semantic["chat"]
        assert settings.threshold == point.cosine_threshold
        assert settings.verifier_threshold == (point.verifier_threshold if point.verifier else None)
        assert (pipeline.verifier is not None) == point.verifier
    finally:
        pipeline.close()


def test_config_rejects_threshold_with_target_and_stale_points(tmp_path: Path, embedder: Any) -> None:
    verifier_dir = tmp_path / "unused"
    with pytest.raises(ConfigError, match=r"routes\.0\.semantic.*either threshold or target_precision"):
        parse_config(_config(tmp_path, verifier_dir, target_precision=0.95))  # route_config sets threshold 0.9
    raw = _config(tmp_path, verifier_dir)
    raw["routes"][0]["semantic"] = {"target_precision": 0.99}
    path = operating_point_path(tmp_path / "cache", "chat")
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "route": "chat",
                "target_precision": 0.9,
                "cosine_threshold": 0.8,
                "verifier": False,
                "verifier_threshold": None,
                "candidates": 1,
                "expected_precision": 0.91,
                "expected_recall": 0.3,
            }
        )
    )
    with pytest.raises(ConfigError, match=r"target_precision: 0\.99, but the tuned point was made for 0\.9"):
        build_pipeline(parse_config(raw), embedder=embedder)


def test_missing_verifier_fails_at_start_up(tmp_path: Path, embedder: Any) -> None:
    raw = _config(tmp_path, tmp_path / "no-such-verifier", verifier=True)
    with pytest.raises(ConfigError, match=r"routes\.0\.semantic\.verifier: no trained verifier.*kvgate tune"):
        build_pipeline(parse_config(raw), embedder=embedder)


# ------------------------------------------------------------------------------------------ end to end
def test_proxy_serves_only_what_the_verifier_accepts(
    make_proxy: Any, backend: Any, tiny_verifier_dir: Path, tiny_verifier: Verifier, tmp_path: Path
) -> None:
    """The stage end to end with a real trained model: a cosine candidate (0.96 here) that the
    verifier scores under `verifier_threshold` is a miss answered by the backend and counted as a
    rejection; one it scores above is served. Both pairs are ones the tiny verifier was taught."""
    rejected = ("How should I wash a cast iron skillet?", "How should I not wash a cast iron skillet?")
    accepted = ("How do I fix a leaking faucet?", "How can I repair a leaking faucet?")
    low, high = (float(x) for x in tiny_verifier.score([rejected, accepted]))
    assert low < 0.5 < high, (low, high)
    raw = route_config(backend.api_base, tmp_path / "cache", threshold=0.8, verifier=True)
    raw["embedder"] = {"verifier_path": str(tiny_verifier_dir)}
    proxy = make_proxy(raw=raw)
    for cached, _ in (rejected, accepted):
        assert proxy.chat(cached).headers["x-kvgate-cache"] == "miss"
    calls = backend.count
    other = proxy.chat(rejected[1])
    assert other.status_code == 200 and other.headers["x-kvgate-cache"] == "miss"
    assert backend.count == calls + 1  # answered by the backend, not by the cached answer
    assert proxy.chat(accepted[1]).headers["x-kvgate-cache"] == "semantic"
    assert backend.count == calls + 1
    metrics = proxy.http.get("/metrics").text
    assert 'kvgate_verifier_rejections_total{route="chat"} 1.0' in metrics


def test_without_verifier_the_same_pair_is_a_wrong_hit(make_proxy: Any, tmp_path: Path) -> None:
    """Why the stage exists: the embedding alone serves the week answer to the month question
    (cosine 0.74) and Java's answer to Python's (0.99)."""
    proxy = make_proxy(threshold=0.7)
    proxy.chat("How can I lose weight in a week?")
    assert proxy.chat("How can I lose weight in a month?").headers["x-kvgate-cache"] == "semantic"
    proxy.chat("Is Python faster than Java?")
    assert proxy.chat("Is Java faster than Python?").headers["x-kvgate-cache"] == "semantic"
    assert proxy.pipeline.verifier is None  # no route uses it: never loaded
