"""`kvgate tune --embedder`: fine-tune the embedder on labelled pairs, score it, write a model dir.

Steps, each reported on stderr:
1. read the pairs and split them (kvgate.tools.tuning.split: grouped by question, so no question is on
   two sides) into train / calib / holdout;
2. reuse the model dir of the same data and settings when it exists (--retrain forces training);
   else fine-tune the packaged MiniLM on the train part (kvgate.tools.tuning.embedder_train, bounded by
   --max-minutes) and save it as a sentence-transformers dir;
3. export it to ONNX the way the proxy loads any embedder (kvgate.index.responses.embedder_onnx, on first use);
4. score before (packaged MiniLM) and after on the holdout part: precision where recall reaches
   0.90, precision and recall at the default threshold;
5. fit P(duplicate | cosine) on the calib part (kvgate.index.responses.trust's logistic fit) as a calibration
   record; write the manifest (kvgate.index.responses.embedder.MANIFEST) and print a summary.

The dir is what `embedder.model_path` names. Its manifest's `identity` (a digest of the weights)
is what a cache records beside its vectors, so a cache never mixes two embedders' vectors.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kvgate.middleware.progress import say
from kvgate.tools.tuning.embedder_train import EmbedderTrainConfig, pair_cosines, precision_at_recall, scores_at
from kvgate.tools.tuning.split import DEFAULT_FRACTIONS, DEFAULT_SEED, assign_parts, indices

progress = say("tune --embedder")
REPORT_RECALL = 0.90
DEFAULT_THRESHOLD = 0.9  # semantic.threshold's default: what a route without tuning uses
VERSION = 1


def data_digest(rows: list[tuple[str, str, bool]], cfg: EmbedderTrainConfig) -> str:
    """Names a tuned model after everything that shapes it: the rows, the training settings
    (threads and the time budget aside: they change speed, not the recipe), the split."""
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(list(row)).encode())
    shaping = {k: v for k, v in asdict(cfg).items() if k not in ("threads", "max_minutes")}
    h.update(
        json.dumps({"cfg": shaping, "split": [DEFAULT_FRACTIONS, DEFAULT_SEED], "v": VERSION}, sort_keys=True).encode()
    )
    return h.hexdigest()[:16]


def default_dir(digest: str) -> Path:
    from kvgate.index.storage.env import model_cache_dir

    return model_cache_dir() / f"embedder-{digest}"


def weights_digest(directory: Path) -> str:
    """SHA-256 of the model's weight files: the embedder's identity (same weights, same vectors)."""
    h = hashlib.sha256()
    for path in sorted(directory.rglob("*.safetensors")):
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:24]


def _metrics(cosines: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    precision, threshold = precision_at_recall(cosines, labels, REPORT_RECALL)
    return {
        "precision_at_recall_0.90": None if precision is None else round(precision, 4),
        "threshold_at_recall_0.90": None if threshold is None else round(threshold, 4),
        "at_default_threshold": scores_at(cosines, labels, DEFAULT_THRESHOLD),
    }


def ensure_tuned_embedder(
    pairs_path: Path,
    out_dir: Path | None = None,
    retrain: bool = False,
    cfg: EmbedderTrainConfig = EmbedderTrainConfig(),
    log: Callable[[str], None] = progress,
) -> tuple[Path, dict[str, Any]]:
    """The tuned model dir for `pairs_path` (reused when its manifest names the same data digest,
    unless `retrain`), and its manifest."""
    from kvgate.index.responses.embedder import MANIFEST, make_embedder, packaged_minilm_path, read_manifest
    from kvgate.index.responses.trust import Observation, fit_rule
    from kvgate.tools.tuning.pairs import read_pairs

    pairs, _skipped = read_pairs(pairs_path)
    rows = [(p.question1, p.question2, p.duplicate) for p in pairs]
    digest = data_digest(rows, cfg)
    target = out_dir or default_dir(digest)
    found = read_manifest(target)
    if found is not None and found.get("data_digest") == digest and not retrain:
        log(f"reusing the tuned embedder in {target} (trained on the same data; --retrain to train again)")
        return target, found | {"reused": True}
    parts = assign_parts([(a, b) for a, b, _ in rows])
    split = {part: [rows[i] for i in indices(parts, part)] for part in ("train", "calib", "holdout")}
    log(
        f"{len(rows)} pairs from {pairs_path}: "
        + ", ".join(f"{part} {len(r)} ({sum(d for *_, d in r)} duplicates)" for part, r in split.items())
    )
    holdout_labels = np.array([d for *_, d in split["holdout"]], dtype=bool)
    base = packaged_minilm_path()
    before = _metrics(pair_cosines(make_embedder("onnx").embed, split["holdout"]), holdout_labels)
    log(f"before (packaged MiniLM), holdout: precision {before['precision_at_recall_0.90']} at recall 0.90")
    log(
        f"training on {len(split['train'])} pairs: ≤ {cfg.epochs} epoch(s), batch {cfg.batch_size}, "
        f"≤ {cfg.max_minutes} min, {cfg.threads} threads"
    )
    from kvgate.tools.tuning.embedder_train import train_embedder

    started = time.perf_counter()
    model, facts = train_embedder(split["train"], base, cfg, log)
    tuning_seconds = round(time.perf_counter() - started, 1)
    tmp = target.parent / f".{target.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    model.save(str(tmp))
    identity = f"tuned:{weights_digest(tmp)}"
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    log(f"trained in {tuning_seconds}s; exporting to ONNX")
    tuned = make_embedder("onnx", target)  # the proxy's own loader: exports once, then loads
    after = _metrics(pair_cosines(tuned.embed, split["holdout"]), holdout_labels)
    calib_cos = pair_cosines(tuned.embed, split["calib"])
    rule = fit_rule([Observation(float(s), bool(d)) for s, (*_, d) in zip(calib_cos, split["calib"])])
    manifest = {
        "version": VERSION,
        "identity": identity,
        "base_model": str(base),
        "dim": int(tuned.dim),
        "pairs_file": str(pairs_path),
        "data_digest": digest,
        "split": {
            "seed": DEFAULT_SEED,
            "fractions": list(DEFAULT_FRACTIONS),
            **{p: {"pairs": len(r), "duplicates": int(sum(d for *_, d in r))} for p, r in split.items()},
        },
        "train_config": asdict(cfg),
        "training": facts,
        "tuning_seconds": tuning_seconds,
        "holdout_before": before,
        "holdout_after": after,
        "calibration": {
            "note": "P(duplicate | cosine) on the calib part, kvgate.index.responses.trust's logistic fit",
            "coef": list(rule.coef),
            "cov": [list(r) for r in rule.cov],
            "n": rule.n,
            "midpoint": round(rule.threshold, 4),
        },
    }
    (target / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return target, manifest | {"reused": False}


def main(args: Any) -> int:
    """`kvgate tune --embedder`: 0 when the model dir is written (or reused), 2 on bad input."""
    import sys

    from kvgate.tools.tuning.pairs import BenchInputError

    if args.max_minutes is not None and args.max_minutes <= 0:
        print(f"kvgate tune: error: --max-minutes must be positive, got {args.max_minutes}", file=sys.stderr)
        return 2
    cfg = EmbedderTrainConfig(
        **{
            k: v
            for k, v in (("max_minutes", args.max_minutes), ("epochs", args.epochs), ("max_steps", args.max_steps))
            if v is not None
        }
    )
    try:
        directory, manifest = ensure_tuned_embedder(args.pairs, args.out_dir, args.retrain, cfg)
    except BenchInputError as exc:
        print(f"kvgate tune: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(manifest | {"dir": str(directory)}, indent=2) + "\n")
    print_summary(directory, manifest)
    return 0


def print_summary(directory: Path, manifest: dict[str, Any]) -> None:
    b, a = manifest["holdout_before"], manifest["holdout_after"]
    held = manifest["split"]["holdout"]
    print(
        f"tuned embedder: {directory} ({'reused' if manifest.get('reused') else 'trained'}; "
        f"{manifest['training']['steps']} batches in {manifest['tuning_seconds']}s)"
    )
    print(f"held-out pairs ({held['pairs']}, {held['duplicates']} duplicates, no question shared with training):")
    for name, m in (("packaged MiniLM", b), ("tuned", a)):
        d = m["at_default_threshold"]
        print(
            f"  {name}: precision {m['precision_at_recall_0.90']} at recall 0.90 (cosine ≥ "
            f"{m['threshold_at_recall_0.90']}); at cosine ≥ {d['threshold']}: precision {d['precision']} "
            f"recall {d['recall']}"
        )
    print(f"use it: embedder: {{model_path: {directory}}} (a fresh cache_dir: a cache keeps one embedder's vectors)")
