"""`kvgate bench semantic`'s command line: its options, their checks, and which run they start.

The runs are elsewhere in this package: pairs_run (--pairs), proxy_run (--entries); the tables
and the JSON file are report's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from kvgate.tools.bench.plot import add_plot_option, write_plot
from kvgate.tools.bench.semantic.report import print_pairs_summary, print_proxy_summary, write_json
from kvgate.tools.tuning.pairs import BenchInputError

DEFAULT_PAIRS_THRESHOLD = 0.9
DEFAULT_PROXY_THRESHOLD = 0.8
DEFAULT_LATENCY_QUERIES = 1000
DEFAULT_PROXY_QUERIES = 300
DEFAULT_FILLER_PAIRS = Path("../shared/data/qqp_dev.csv")  # as the Makefile's PAIRS
DEFAULT_FILLER_POSITIVES = Path("../shared/data/gptcache_mock_pairs.json")  # as the Makefile's POSITIVES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `kvgate bench semantic`."""
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--pairs",
        type=Path,
        metavar="FILE.csv",
        help="precision/recall mode: CSV with columns question1,question2,is_duplicate",
    )
    mode.add_argument(
        "--entries",
        type=int,
        metavar="N",
        help="proxy latency mode: pre-fill the scope with N entries, then time requests",
    )
    parser.add_argument("--json", type=Path, metavar="OUT", default=None, help="write the results here (JSON)")
    add_plot_option(parser)  # --pairs: precision / recall vs threshold
    parser.add_argument(
        "--threshold",
        type=float,
        default=None,
        help=f"cosine similarity for a hit (default {DEFAULT_PAIRS_THRESHOLD} with --pairs, {DEFAULT_PROXY_THRESHOLD} with --entries)",
    )
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="--pairs: use the first N usable pairs")
    parser.add_argument(
        "--latency-queries",
        type=int,
        default=None,
        metavar="N",
        help=f"--pairs: time the first N lookups one at a time (default {DEFAULT_LATENCY_QUERIES})",
    )
    parser.add_argument(
        "--queries",
        type=int,
        default=None,
        metavar="N",
        help=f"--entries: exact and semantic requests to time (default {DEFAULT_PROXY_QUERIES})",
    )
    parser.add_argument(
        "--filler",
        choices=["real", "random"],
        default=None,
        help="--entries: what fills the scope: real questions and variants of them (default; needs --filler-pairs) or random unit vectors",
    )
    parser.add_argument(
        "--filler-pairs",
        type=Path,
        default=None,
        metavar="FILE.csv",
        help=f"--entries --filler real: QQP-format questions (default {DEFAULT_FILLER_PAIRS})",
    )
    parser.add_argument(
        "--filler-positives",
        type=Path,
        default=None,
        metavar="FILE.json",
        help=f"--entries --filler real: GPTCache mock pairs [{{origin, similar}}] (default {DEFAULT_FILLER_POSITIVES} when it exists)",
    )
    parser.add_argument(
        "--route",
        default=None,
        metavar="NAME",
        help="--pairs: use this route's operating point (its tuned point with target_precision, "
        "from --config's cache_dir, else ./.kvgate) instead of --threshold",
    )
    parser.add_argument("--config", type=Path, default=None, metavar="CONFIG", help="--pairs: config holding --route")
    parser.add_argument(
        "--holdout",
        action="store_true",
        help="--pairs: evaluate only the held-out part of the deterministic split `kvgate tune` uses",
    )
    parser.add_argument("--no-verifier", action="store_true", help="--pairs: skip the run with the verifier")
    parser.add_argument(
        "--stages",
        action="store_true",
        help="--pairs: instead of precision/recall, time the stages of the first --latency-queries "
        "lookups in kvgate and GPTCache, interleaved (tools/bench/semantic/stages.py)",
    )


def main(args: argparse.Namespace) -> int:
    """Run the chosen mode; 0 on success, 2 on bad input (message on stderr)."""
    try:
        if args.pairs is not None and args.stages:
            from kvgate.tools.bench.semantic.stages import print_stages, run_stages

            result = run_stages(**_stages_options(args))
            print_stages(result)
        elif args.pairs is not None:
            from kvgate.tools.bench.semantic.pairs_run import run_pairs

            result = run_pairs(**_pairs_options(args))
            print_pairs_summary(result)
        else:
            from kvgate.tools.bench.semantic.proxy_run import run_proxy

            result = run_proxy(**_proxy_options(args))
            print_proxy_summary(result)
    except BenchInputError as exc:
        print(f"kvgate bench semantic: error: {exc}", file=sys.stderr)
        return 2
    if args.json is not None:
        write_json(args.json, result)
        print(f"results written to {args.json}")
    return write_plot("semantic", args.plot, result)


def _reject_other_mode(args: argparse.Namespace, names: Sequence[str], mode: str) -> None:
    given = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n, None) is not None]
    if given:
        raise BenchInputError(f"{', '.join(given)} only applies to the other mode, not {mode}")


def _check_threshold(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise BenchInputError(f"--threshold must be between 0 and 1, got {value}")
    return value


def _pairs_options(args: argparse.Namespace) -> dict[str, Any]:
    _reject_other_mode(args, ["queries", "filler", "filler_pairs", "filler_positives"], "--pairs")
    if args.limit is not None and args.limit < 1:
        raise BenchInputError(f"--limit must be at least 1, got {args.limit}")
    latency = DEFAULT_LATENCY_QUERIES if args.latency_queries is None else args.latency_queries
    if latency < 1:
        raise BenchInputError(f"--latency-queries must be at least 1, got {latency}")
    settings, verifier_path = _route_settings(args)
    threshold = (
        settings.threshold if settings else DEFAULT_PAIRS_THRESHOLD if args.threshold is None else args.threshold
    )
    return {
        "path": args.pairs,
        "threshold": _check_threshold(threshold),
        "limit": args.limit,
        "latency_queries": latency,
        "settings": settings,
        "holdout": args.holdout,
        "verifier": not args.no_verifier,
        "verifier_path": verifier_path,
    }


def _stages_options(args: argparse.Namespace) -> dict[str, Any]:
    if args.route is not None or args.config is not None or args.holdout:
        raise BenchInputError(
            "--stages times lookups at --threshold on the first pairs: no --route, --config, --holdout"
        )
    options = _pairs_options(args)
    return {k: options[k] for k in ("path", "threshold", "limit")} | {"queries": options["latency_queries"]}


def _route_settings(args: argparse.Namespace) -> tuple[Any, str | None]:
    """(SemanticSettings of --route or None, the configured verifier dir or None)."""
    from kvgate.middleware.cache.verification import resolve
    from kvgate.middleware.config import Config, RouteConfig, load_config
    from kvgate.middleware.errors import ConfigError

    if args.route is None:
        if args.config is not None:
            raise BenchInputError("--config needs --route (the route whose operating point to use)")
        return None, None
    if args.threshold is not None:
        raise BenchInputError("give --threshold or --route, not both (the route has its own threshold)")
    try:
        config = load_config(args.config) if args.config else None
        if config is None:  # no config: the route is only a name for its tuned point in ./.kvgate
            route = RouteConfig(name=args.route, model="*", semantic={"target_precision": 0.5})
            return resolve(route, Config.model_fields["cache_dir"].default, 0), None
        position = next((i for i, r in enumerate(config.routes) if r.name == args.route), None)
        if position is None:
            raise BenchInputError(f"{args.config} has no route named {args.route!r}")
        return resolve(config.routes[position], config.cache_dir, position), config.embedder.verifier_path
    except ConfigError as exc:
        raise BenchInputError(exc.message) from None


def _proxy_options(args: argparse.Namespace) -> dict[str, Any]:
    _reject_other_mode(args, ["limit", "latency_queries", "route", "config"], "--entries")
    if args.holdout or args.no_verifier or args.stages:
        raise BenchInputError("--holdout, --no-verifier and --stages only apply to --pairs")
    if args.entries < 0:
        raise BenchInputError(f"--entries must be 0 or more, got {args.entries}")
    queries = DEFAULT_PROXY_QUERIES if args.queries is None else args.queries
    if queries < 1:
        raise BenchInputError(f"--queries must be at least 1, got {queries}")
    threshold = DEFAULT_PROXY_THRESHOLD if args.threshold is None else args.threshold
    filler = args.filler or "real"
    pairs, positives = args.filler_pairs, args.filler_positives
    if filler == "random":
        if pairs is not None or positives is not None:
            raise BenchInputError("--filler-pairs and --filler-positives only apply to --filler real")
    else:
        if pairs is None:
            pairs = DEFAULT_FILLER_PAIRS
            if not pairs.is_file():
                raise BenchInputError(
                    f"--filler real needs questions: {pairs} does not exist; give --filler-pairs "
                    "FILE.csv (QQP format) or use --filler random"
                )
        if positives is None and DEFAULT_FILLER_POSITIVES.is_file():
            positives = DEFAULT_FILLER_POSITIVES
    return {
        "entries": args.entries,
        "queries": queries,
        "threshold": _check_threshold(threshold),
        "filler": filler,
        "pairs_path": pairs,
        "positives_path": positives,
    }
