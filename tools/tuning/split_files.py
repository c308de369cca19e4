"""`kvgate tune --split`: cut a labelled pairs file into a training file and an evaluation file
that share no question (kvgate.tools.tuning.split's grouped, deterministic split), so a model trained on
one is scored on questions it never saw (`kvgate bench trust --train-pairs A --pairs B`)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

from kvgate.tools.tuning.pairs import BenchInputError, Pair, read_pairs
from kvgate.tools.tuning.split import DEFAULT_SEED, assign_parts

DEFAULT_EVAL_FRACTION = 0.4
# A seed of its own: with split.py's default seed, every group of the train file would fall in the
# train part again when `kvgate tune` splits that file, leaving it no calibration or holdout pairs.
FILES_SEED = DEFAULT_SEED + "-files"


def split_pairs(
    pairs: list[Pair], eval_fraction: float = DEFAULT_EVAL_FRACTION, seed: str = FILES_SEED
) -> tuple[list[Pair], list[Pair]]:
    """(train, eval): each connected group of pairs (pairs sharing a question) wholly on one side.

    Invariant: no normalised question (kvgate.tools.tuning.split.normalise) is in both."""
    parts = assign_parts([(p.question1, p.question2) for p in pairs], (1.0 - eval_fraction, 0.0, eval_fraction), seed)
    return (
        [p for p, part in zip(pairs, parts) if part == "train"],
        [p for p, part in zip(pairs, parts) if part == "holdout"],
    )


def write_pairs(path: Path, pairs: list[Pair]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["question1", "question2", "is_duplicate"])
        out.writerows([p.question1, p.question2, int(p.duplicate)] for p in pairs)


def main(args: Any) -> int:
    """Write <out-dir>/<stem>_train.csv and <stem>_eval.csv; 2 on bad input."""
    fraction = args.eval_fraction
    try:
        if args.out_dir is None:
            raise BenchInputError("--split needs --out-dir DIR")
        if not 0.0 < fraction < 1.0:
            raise BenchInputError(f"--eval-fraction must be between 0 and 1, got {fraction}")
        pairs, skipped = read_pairs(args.pairs)
    except BenchInputError as exc:
        print(f"kvgate tune: error: {exc}", file=sys.stderr)
        return 2
    train, evaluation = split_pairs(pairs, fraction)
    stem = args.pairs.stem
    for name, part in (("train", train), ("eval", evaluation)):
        target = args.out_dir / f"{stem}_{name}.csv"
        write_pairs(target, part)
        print(f"{target}: {len(part)} pairs ({sum(p.duplicate for p in part)} duplicates)")
    if skipped:
        print(f"({skipped} rows with an empty question skipped)")
    return 0
