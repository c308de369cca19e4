"""The work of `kvgate tune` (tools/tuning/tune.py is its command line): split the labelled pairs,
load or train the verifier, calibrate the operating point in the cache setting, score it on the
holdout part and write it where the pipeline reads it.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from kvgate.middleware.progress import say
from kvgate.tools.tuning import calibrate
from kvgate.tools.tuning.calibrate import Candidates, Point
from kvgate.tools.tuning.split import DEFAULT_FRACTIONS, Part, assign_parts, indices
from kvgate.tools.tuning.train import TrainConfig


class TuneError(ValueError):
    """A problem with tune's input, shown to the user as one line."""


progress = say("tune")  # status lines on stderr that keep a progress bar intact


# ------------------------------------------------------------------------------------------ input
def read_positives(path: Path) -> list[tuple[str, str]]:
    """[{origin, similar}, ...] (GPTCache's mock data format) → (origin, similar) pairs."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise TuneError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise TuneError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, list) or not all(isinstance(d, dict) and "origin" in d and "similar" in d for d in data):
        raise TuneError(f'{path}: expected a list of {{"origin": ..., "similar": ...}} objects')
    return [(str(d["origin"]), str(d["similar"])) for d in data if d["origin"] and d["similar"]]


def data_digest(rows: Sequence[Sequence[Any]]) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(list(row)).encode())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------------------ the work
def ensure_verifier(
    directory: Path,
    train_rows: list[tuple[str, str, bool]],
    train_positives: list[tuple[str, str]],
    cfg: TrainConfig,
    retrain: bool,
    log: Callable[[str], None] = progress,
) -> tuple[Any, dict[str, Any]]:
    """Load the verifier in `directory`, or train + export one there; returns (verifier, info)."""
    from kvgate.index.responses.embedder import packaged_minilm_path
    from kvgate.index.responses.verifier import load_verifier

    base = packaged_minilm_path()
    fingerprint = cfg.fingerprint(data_digest(train_rows + [(a, b, True) for a, b in train_positives]), base)
    info: dict[str, Any] = {"dir": str(directory), "fingerprint": fingerprint}
    if (directory / "model.onnx").is_file() and not retrain:
        verifier = load_verifier(directory)
        trained_on = verifier.meta.get("fingerprint")  # type: ignore[attr-defined]
        meta = verifier.meta  # type: ignore[attr-defined]
        info |= {
            "trained": False,
            "trained_fingerprint": trained_on,
            "train_seconds": meta.get("train_seconds"),
            "train_cpu_seconds": meta.get("train_cpu_seconds"),
        }
        if trained_on != fingerprint:
            log(
                f"using the verifier in {directory} (trained on other data or settings: {trained_on}); "
                "--retrain to train on this file's train part"
            )
        return verifier, info
    from kvgate.tools.tuning.train import build_examples, export_verifier, train_cross_encoder

    examples = build_examples(train_rows, train_positives, cfg)
    positives = sum(1 for *_, y in examples if y > 0.5)
    log(
        f"training the verifier: {len(examples)} examples ({positives} positive), {cfg.epochs} epoch(s), "
        f"{cfg.layers} layers, {cfg.threads} threads"
    )
    started, cpu_started = time.perf_counter(), time.process_time()
    model, tok = train_cross_encoder(examples, base, cfg)
    seconds = round(time.perf_counter() - started, 1)
    cpu = round(time.process_time() - cpu_started, 1)  # all threads; wall time on a busy machine says little
    log(f"trained in {seconds}s ({cpu} CPU-s); exporting to ONNX at {directory}")
    meta = {
        "fingerprint": fingerprint,
        "max_length": cfg.max_length,
        "train_seconds": seconds,
        "train_cpu_seconds": cpu,
        "examples": len(examples),
        "config": cfg.__dict__,
        "base": str(base),
    }
    export_verifier(model, tok, directory, meta)
    info |= {"trained": True, "train_seconds": seconds, "train_cpu_seconds": cpu, "examples": len(examples)}
    return load_verifier(directory), info


def cache_candidates(
    rows: Sequence[tuple[str, str, bool]], embedder: Any, verifier: Any, k: int, label: str
) -> Candidates:
    from kvgate.tools.tuning.candidates import build_candidates, embed_all

    q1 = [a for a, _, _ in rows]
    q2 = [b for _, b, _ in rows]
    progress(f"{label}: embedding {len(rows)} pairs")
    v1, v2 = embed_all(embedder, q1, f"{label}: question1"), embed_all(embedder, q2, f"{label}: question2")
    return build_candidates(q1, q2, [d for *_, d in rows], v1, v2, verifier, k, min(calibrate.COSINE_GRID), progress)


def run_tune(
    pairs_path: Path,
    route: str,
    cache_dir: Path,
    target: float,
    cfg: TrainConfig,
    *,
    positives_path: Path | None = None,
    verifier_dir: Path | None = None,
    retrain: bool = False,
    use_verifier: bool | None = None,
    candidates: int = 3,
    min_hits: int = calibrate.MIN_HITS,
) -> dict[str, Any]:
    """The whole tune (its steps: tools/tuning/tune.py's docstring); returns the report. Writes the
    point if one qualifies."""
    from kvgate.index.responses.embedder import make_embedder
    from kvgate.index.responses.verifier import default_verifier_dir
    from kvgate.middleware.cache.operating_point import OperatingPoint, write_operating_point
    from kvgate.tools.tuning.pairs import BenchInputError, read_pairs

    started = time.perf_counter()
    try:
        pairs, skipped = read_pairs(pairs_path)
    except BenchInputError as exc:
        raise TuneError(str(exc)) from None
    rows = [(p.question1, p.question2, p.duplicate) for p in pairs]
    parts = assign_parts([(a, b) for a, b, _ in rows])
    split = {part: [rows[i] for i in indices(parts, part)] for part in ("train", "calib", "holdout")}
    progress(
        f"{len(rows)} pairs from {pairs_path}: "
        + ", ".join(f"{part} {len(r)} ({sum(d for *_, d in r)} duplicates)" for part, r in split.items())
    )
    extra = read_positives(positives_path) if positives_path else []
    extra_parts: list[Part] = assign_parts(extra) if extra else []
    extra_train = [extra[i] for i in indices(extra_parts, "train")]
    extra_holdout = [extra[i] for i in indices(extra_parts, "holdout")]
    if not split["calib"] or not any(d for *_, d in split["calib"]):
        raise TuneError(f"{pairs_path}: the calibration part has no duplicate pairs; need more labelled pairs")

    verifier, verifier_info = None, {"used": False}
    if use_verifier is not False:
        directory = verifier_dir or default_verifier_dir()
        verifier, verifier_info = ensure_verifier(directory, split["train"], extra_train, cfg, retrain)
        verifier_info["used"] = True
    embedder = make_embedder("onnx")
    calib = cache_candidates(split["calib"], embedder, verifier, candidates, "calib")
    cosine_points = calibrate.sweep(calib, with_verifier=False)
    verified_points = calibrate.sweep(calib) if verifier is not None else []
    best_cosine = calibrate.pick(cosine_points, target, min_hits)
    best_verified = calibrate.pick(verified_points, target, min_hits) if verified_points else None
    chosen = best_verified
    if use_verifier is None and (
        chosen is None or (best_cosine is not None and (best_cosine.recall or 0) >= (chosen.recall or 0))
    ):
        chosen = best_cosine  # no verifier needed: as good without it (a route that says verifier: true keeps it)
    if use_verifier is False:
        chosen = best_cosine
    holdout = (
        cache_candidates(split["holdout"], embedder, verifier, candidates, "holdout") if split["holdout"] else None
    )

    report: dict[str, Any] = {
        "route": route,
        "target_precision": target,
        "pairs_file": str(pairs_path),
        "pairs": len(rows),
        "skipped_rows": skipped,
        "split": {p: {"pairs": len(r), "duplicates": int(sum(d for *_, d in r))} for p, r in split.items()},
        "split_fractions": DEFAULT_FRACTIONS,
        "candidates": candidates,
        "min_hits": min_hits,
        "verifier": verifier_info,
        "calib_best_cosine_only": best_cosine.as_dict() if best_cosine else None,
        "calib_best_verified": best_verified.as_dict() if best_verified else None,
        "calib_curve_cosine_only": calibrate.curve(cosine_points),
        "calib_curve_verified": calibrate.curve(verified_points) if verified_points else [],
    }
    if holdout is not None:
        report["holdout_curve_cosine_only"] = calibrate.curve(calibrate.sweep(holdout, with_verifier=False))
        if verifier is not None:
            report["holdout_curve_verified"] = calibrate.curve(calibrate.sweep(holdout))
    if chosen is None:
        report["written"] = None
        report["duration_s"] = round(time.perf_counter() - started, 1)
        return report
    held = (
        calibrate.evaluate(holdout, chosen.cosine_threshold, chosen.verifier_threshold) if holdout is not None else None
    )
    extra_recall = _positives_recall(extra_holdout, embedder, verifier, candidates, chosen) if extra_holdout else None
    point = OperatingPoint(
        route=route,
        target_precision=target,
        cosine_threshold=chosen.cosine_threshold,
        verifier=chosen.verifier_threshold is not None,
        verifier_threshold=chosen.verifier_threshold,
        candidates=candidates if chosen.verifier_threshold is not None else 1,
        expected_precision=chosen.precision or 0.0,
        expected_recall=chosen.recall or 0.0,
        calibration={
            "pairs_file": str(pairs_path),
            "pairs": len(split["calib"]),
            "duplicates": int(calib.duplicate.sum()),
            "hits": chosen.hits,
            "correct_hits": chosen.correct_hits,
            "precision_95ci": calibrate.wilson_interval(chosen.correct_hits, chosen.hits),
        },
        holdout=(held.as_dict() | {"pairs": len(split["holdout"])}) if held else {},
        verifier_model={k: verifier_info.get(k) for k in ("dir", "fingerprint", "trained_fingerprint", "train_seconds")}
        if verifier is not None
        else {},
    )
    path = write_operating_point(cache_dir, point)
    report |= {
        "operating_point": json.loads(point.to_json()),
        "written": str(path),
        "positives_holdout_recall": extra_recall,
        "duration_s": round(time.perf_counter() - started, 1),
    }
    return report


def _positives_recall(
    pairs: list[tuple[str, str]], embedder: Any, verifier: Any, k: int, point: Point
) -> dict[str, Any]:
    """Recall at `point` when every pair is a duplicate (origin cached, similar looked up)."""
    c = cache_candidates(
        [(a, b, True) for a, b in pairs],
        embedder,
        verifier if point.verifier_threshold is not None else None,
        k,
        "held-out positives",
    )
    scored = calibrate.evaluate(c, point.cosine_threshold, point.verifier_threshold)
    return {"pairs": len(pairs), "hits": scored.hits, "correct_hits": scored.correct_hits, "recall": scored.recall}
