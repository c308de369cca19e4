"""`kvgate tune`: train (or load) the verifier, calibrate a route's operating point, write it.

Steps (kvgate.tools.tuning.tune_run), each reported on stderr:
1. read the labelled pairs and split them (kvgate.tools.tuning.split: deterministic, grouped by
   question) into train / calib / holdout;
2. the verifier: load the one in the model cache, or train it on the train part (plus synthetic
   hard negatives and optional extra positives) and export it to ONNX (--retrain forces this);
3. calibrate on the calib part, in the cache setting (kvgate.tools.tuning.calibrate): the
   (cosine threshold, verifier threshold) with the best recall whose precision meets the target;
   the cosine-only point is computed too and used when it is as good or the route says verifier: false;
4. score that point on the holdout part (and on the held-out extra positives: recall);
5. write `<cache_dir>/tuned/<route>.json`, which the pipeline reads at start-up.

`--embedder` fine-tunes the embedder instead (kvgate.tools.tuning.embedder_tune); `--split` writes a
training and an evaluation file (kvgate.tools.tuning.split_files).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvgate.tools.tuning import calibrate
from kvgate.tools.tuning.train import TrainConfig
from kvgate.tools.tuning.tune_run import TuneError, run_tune

DEFAULT_TARGET = 0.95


# ------------------------------------------------------------------------------------------ CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `kvgate tune`."""
    parser.add_argument(
        "--pairs",
        type=Path,
        required=True,
        metavar="FILE.csv",
        help="labelled pairs, columns question1,question2,is_duplicate",
    )
    parser.add_argument("--route", default=None, metavar="NAME", help="route whose operating point to write")
    parser.add_argument(
        "--embedder",
        action="store_true",
        help="fine-tune the embedder on --pairs instead (a model dir for embedder.model_path)",
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help="write --pairs as a training and an evaluation file sharing no question, into --out-dir",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="--embedder: the model dir (default: the model cache, named by the data); --split: where the files go",
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        metavar="M",
        help="--embedder: wall-clock budget for training (default 12)",
    )
    parser.add_argument(
        "--max-steps", type=int, default=None, metavar="N", help="--embedder: cap training batches (quick runs)"
    )
    parser.add_argument(
        "--eval-fraction",
        type=float,
        default=0.4,
        metavar="F",
        help="--split: share of the question groups that go to the evaluation file (default 0.4)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="CONFIG",
        help="config file: its cache_dir receives tuned/<route>.json (default ./.kvgate)",
    )
    parser.add_argument(
        "--target-precision",
        type=float,
        default=None,
        metavar="P",
        help=f"precision to meet (default: the route's semantic.target_precision, else {DEFAULT_TARGET})",
    )
    parser.add_argument(
        "--positives",
        type=Path,
        default=None,
        metavar="FILE.json",
        help="extra paraphrase pairs [{origin, similar}, ...]: train part for training, held-out part for a recall check",
    )
    parser.add_argument(
        "--verifier-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the verifier is read / trained to (default: the model cache)",
    )
    parser.add_argument(
        "--retrain", action="store_true", help="train the verifier (--embedder: the embedder) even if one exists"
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help=f"training epochs (default {TrainConfig.epochs}; --embedder: 2)"
    )
    parser.add_argument(
        "--max-examples", type=int, default=None, metavar="N", help="cap training examples (quick runs)"
    )
    parser.add_argument("--layers", type=int, default=None, help=f"encoder layers kept (default {TrainConfig.layers})")
    parser.add_argument(
        "--candidates",
        type=int,
        default=None,
        metavar="K",
        help="entries the verifier reads per lookup (default: the route's semantic.candidates)",
    )
    parser.add_argument(
        "--min-hits",
        type=int,
        default=calibrate.MIN_HITS,
        metavar="N",
        help=f"a point needs this many calibration hits to count (default {calibrate.MIN_HITS})",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the full report here")


def main(args: argparse.Namespace) -> int:
    """0 when an operating point was written, 1 when the target is out of reach, 2 on bad input."""
    if args.split:
        from kvgate.tools.tuning.split_files import main as split_main

        return split_main(args)
    if args.embedder:
        from kvgate.tools.tuning.embedder_tune import main as embedder_main

        return embedder_main(args)
    if args.route is None:
        print("kvgate tune: error: --route NAME is required (or --embedder, or --split)", file=sys.stderr)
        return 2
    from kvgate.middleware.config import Config, load_config
    from kvgate.middleware.errors import ConfigError

    try:
        config = load_config(args.config) if args.config else None
        cache_dir = config.cache_dir if config else Config.model_fields["cache_dir"].default
        route = next((r for r in config.routes if r.name == args.route), None) if config else None
        if config and route is None:
            raise TuneError(
                f"{args.config} has no route named {args.route!r} (routes: {', '.join(r.name for r in config.routes)})"
            )
        target = args.target_precision or (route.semantic.target_precision if route else None) or DEFAULT_TARGET
        if not 0.0 < target < 1.0:
            raise TuneError(f"--target-precision must be between 0 and 1, got {target}")
        use_verifier = route.semantic.verifier if route is not None else None
        candidates = args.candidates or (route.semantic.candidates if route else 3)
        cfg = TrainConfig(
            **{
                k: v
                for k, v in (("epochs", args.epochs), ("max_examples", args.max_examples), ("layers", args.layers))
                if v is not None
            }
        )
        report = run_tune(
            args.pairs,
            args.route,
            Path(cache_dir),
            target,
            cfg,
            positives_path=args.positives,
            verifier_dir=args.verifier_dir,
            retrain=args.retrain,
            use_verifier=use_verifier,
            candidates=candidates,
            min_hits=args.min_hits,
        )
    except (TuneError, ConfigError) as exc:
        print(f"kvgate tune: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    print_summary(report)
    return 0 if report.get("written") else 1


# ------------------------------------------------------------------------------------------ output
def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:.4f}" if isinstance(x, float) else str(x)


def print_summary(report: dict[str, Any]) -> None:
    print(
        f"kvgate tune: route {report['route']}, target precision {report['target_precision']}, "
        f"{report['pairs']} pairs ({report['split']['calib']['pairs']} for calibration, "
        f"{report['split']['holdout']['pairs']} held out)"
    )
    for name in (
        "calib_curve_cosine_only",
        "calib_curve_verified",
        "holdout_curve_cosine_only",
        "holdout_curve_verified",
    ):
        rows = report.get(name) or []
        if rows:
            print(
                f"{name.replace('_', ' ')}: "
                + "  ".join(f"P≥{r['precision_at_least']}: R={_fmt(r.get('recall'))}" for r in rows)
            )
    if not report.get("written"):
        print(
            f"no operating point reaches precision {report['target_precision']} with at least "
            f"{report['min_hits']} calibration hits; nothing written (try a lower --target-precision)"
        )
        return
    op = report["operating_point"]
    verifier = (
        f"verifier ≥ {op['verifier_threshold']:.4f} over top-{op['candidates']}" if op["verifier"] else "no verifier"
    )
    print(
        f"operating point: cosine ≥ {op['cosine_threshold']}, {verifier}; calibration precision "
        f"{op['expected_precision']} recall {op['expected_recall']}; held out: precision "
        f"{_fmt(op['holdout'].get('precision'))} recall {_fmt(op['holdout'].get('recall'))}"
    )
    if report.get("positives_holdout_recall"):
        r = report["positives_holdout_recall"]
        print(f"held-out extra positives: recall {_fmt(r['recall'])} ({r['correct_hits']}/{r['pairs']})")
    print(f"written to {report['written']}")
