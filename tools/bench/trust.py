"""`kvgate bench trust`: wrong-hit rate and hit rate of static thresholds vs `semantic.max_error_rate`.

Method (tools/bench/trust_stream.py builds the stream, tools/bench/trust_replay.py replays it):
every distinct question of the chosen slice of --pairs, in a seeded shuffle, goes through the real
pipeline (Pipeline.complete: real LiteLLM to a deterministic OpenAI-compatible server on 127.0.0.1
that answers each question with its class's canonical answer; real FAISS; embeddings of the real
MiniLM, computed once and kept in the benchmark embedding cache, tools/bench/embed_cache.py).
Requests carry temperature 0, so an exploration's verdict is "the normalised answers are equal".
One fresh cache per setting: each static threshold of the sweep, then each δ. Per setting: hits,
wrong hits (served answer of another class), backend calls (misses + explorations, counted by the
server). The wrong-hit rate is wrong hits per query (vCache's error rate); its 95% upper bound is
Wilson's. The comparisons of explorations run on the pipeline's background worker; the replay
waits for them after each query so that a run is reproducible.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from kvgate.tools.bench.stats import write_json
from kvgate.tools.bench.trust_replay import backend_app, embedding_table, replay, setting_store, sweep
from kvgate.tools.bench.trust_stream import SLICES, build_stream, slice_pairs
from kvgate.tools.tuning.pairs import BenchInputError, read_pairs

DEFAULT_THRESHOLDS = (0.80, 0.85, 0.88, 0.90, 0.92, 0.94, 0.96, 0.98)
DEFAULT_DELTAS = (0.01, 0.02, 0.05)


def best_within(static: list[dict[str, Any]], delta: float, key: str = "error_rate") -> dict[str, Any]:
    """The static threshold with the most hits whose `key` (the measured wrong-hit rate, or with
    key="error_rate_ci_high" its 95% upper bound, the verified runs' test) is ≤ δ."""
    within = [s for s in static if s[key] <= delta]
    best = max(within, key=lambda s: (s["hit_rate"], -s["threshold"]), default=None)
    if best is None:
        return {
            "max_error_rate": delta,
            "threshold": None,
            "hit_rate": 0.0,
            "error_rate": None,
            "error_rate_ci_high": None,
        }
    return {
        "max_error_rate": delta,
        "threshold": best["threshold"],
        "hit_rate": best["hit_rate"],
        "error_rate": best["error_rate"],
        "error_rate_ci_high": best["error_rate_ci_high"],
    }


def ceiling(queries: int, classes: int, deltas: Sequence[float]) -> dict[str, Any]:
    """What no judge can beat on this stream: only a query whose class was asked before can hit
    correctly, so correct hits ≤ queries − classes, and a run that keeps its wrong-hit rate ≤ δ
    hits at most (queries − classes)/queries + δ."""
    repeat = (queries - classes) / queries if queries else 0.0
    return {
        "repeat_rate": round(repeat, 5),
        "max_hit_rate_within": [{"max_error_rate": d, "hit_rate": round(repeat + d, 5)} for d in deltas],
    }


def shared_questions(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many normalised questions two pair lists share (0 for a proper train / eval split)."""
    from kvgate.tools.tuning.split import normalise

    def questions(pairs: Sequence[Any]) -> set[str]:
        return {normalise(q) for p in pairs for q in (p.question1, p.question2)}

    return len(questions(a) & questions(b))


def run(
    path: Path,
    deltas: Sequence[float],
    thresholds: Sequence[float],
    which: str,
    limit: int | None,
    seed: int,
    progress: Callable[[str], None] = lambda _m: None,
    model: str = "minilm",
    store: str = "local",
    train_pairs: Path | None = None,
    tune: dict[str, Any] | None = None,
    prior: bool = True,
) -> dict[str, Any]:
    """With `train_pairs`: the embedder tuned on them (trained once, then reused) judges both the
    static sweep and the δ runs, and the packaged MiniLM's static sweep is reported beside them."""
    from kvgate.index.responses.embedder import make_embedder
    from kvgate.tools.bench.procs import ServerThread
    from kvgate.tools.redis_proc import RedisServer

    pairs, skipped = read_pairs(path, None)
    chosen = slice_pairs(pairs, which)[:limit]
    stream = build_stream(chosen, seed)
    texts = sorted(stream.questions)
    tuned: dict[str, Any] | None = None
    embedder_config: dict[str, Any] = {}
    if train_pairs is not None:
        from kvgate.tools.tuning.embedder_train import EmbedderTrainConfig
        from kvgate.tools.tuning.embedder_tune import ensure_tuned_embedder

        train, _ = read_pairs(train_pairs, None)
        tuned_dir, manifest = ensure_tuned_embedder(train_pairs, cfg=EmbedderTrainConfig(**(tune or {})), log=progress)
        tuned = {
            "dir": str(tuned_dir),
            "train_pairs_file": str(train_pairs),
            "shared_questions_with_eval": shared_questions(train, chosen),
            **{
                k: manifest.get(k)
                for k in (
                    "identity",
                    "reused",
                    "tuning_seconds",
                    "training",
                    "split",
                    "holdout_before",
                    "holdout_after",
                    "calibration",
                )
            },
        }
        real = make_embedder("onnx", model_path=tuned_dir)
        embedder_config = {"model_path": str(tuned_dir), "calibration_prior": prior}
    else:
        real = make_embedder("onnx", model=model)  # type: ignore[arg-type]
    embedder, cache_state = embedding_table(real, texts, progress)
    app = backend_app(stream.answer_of)
    server = ServerThread(app).start()
    redis_server = RedisServer().start() if store == "redis" else None
    url = redis_server.url if redis_server is not None else None
    verified: list[dict[str, Any]] = []
    minilm_static: list[dict[str, Any]] | None = None
    try:
        api_base = f"{server.url}/v1"
        static = sweep(
            stream, thresholds, embedder, api_base, app, store, url, 0, "tuned" if tuned else model, progress
        )
        for n, d in enumerate(deltas, start=len(thresholds)):
            row = {
                "max_error_rate": d,
                **replay(
                    stream,
                    {"max_error_rate": d},
                    embedder,
                    api_base,
                    app,
                    setting_store(store, url, n),
                    embedder_config,
                ),
            }
            verified.append(row)
            progress(
                f"δ {d}: hit rate {row['hit_rate']:.4f}, wrong-hit rate {row['error_rate']:.4f} "
                f"(≤ {row['error_rate_ci_high']:.4f}), backend calls {row['backend_calls']} ({row['seconds']}s)"
            )
        if tuned is not None:
            minilm, _state = embedding_table(make_embedder("onnx"), texts, progress)
            minilm_static = sweep(
                stream, thresholds, minilm, api_base, app, store, url, len(thresholds) + len(deltas), "MiniLM", progress
            )
    finally:
        server.stop()
        if redis_server is not None:
            redis_server.stop()
    result = {
        "mode": "trust",
        "embedder": tuned or model,
        "calibration_prior": bool(tuned) and prior,
        "store": store,
        "pairs_file": str(path),
        "slice": which,
        "limit": limit,
        "seed": seed,
        "pairs_used": len(chosen),
        "rows_skipped": skipped,
        "embedding_cache": cache_state,
        "queries": len(stream.questions),
        "classes": stream.classes,
        "ceiling": ceiling(len(stream.questions), stream.classes, deltas),
        "static": static,
        "verified": verified,
        "best_static_within": [best_within(static, d) for d in deltas],
        "best_static_upper_within": [best_within(static, d, "error_rate_ci_high") for d in deltas],
    }
    if tuned is not None:
        result |= {
            "tuning_seconds": tuned["tuning_seconds"],
            "minilm_static": minilm_static,
            "minilm_best_static_within": [best_within(minilm_static or [], d) for d in deltas],
        }
    return result


def plot(result: dict[str, Any], out: Path) -> None:
    """Hit rate vs wrong-hit rate: the static sweep as a curve, each δ as a point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.4), dpi=90)
    static = sorted(result["static"], key=lambda s: s["error_rate"])
    ax.plot(
        [s["error_rate"] for s in static], [s["hit_rate"] for s in static], "o-", color="grey", label="static threshold"
    )
    if result.get("minilm_static"):
        other = sorted(result["minilm_static"], key=lambda s: s["error_rate"])
        ax.plot(
            [s["error_rate"] for s in other],
            [s["hit_rate"] for s in other],
            "^--",
            color="silver",
            label="static threshold, packaged MiniLM",
        )
    for s in static:
        ax.annotate(
            f"{s['threshold']:.2f}",
            (s["error_rate"], s["hit_rate"]),
            fontsize=6,
            xytext=(3, -6),
            textcoords="offset points",
        )
    for v in result["verified"]:
        ax.errorbar(
            [v["error_rate"]],
            [v["hit_rate"]],
            xerr=[[0], [v["error_rate_ci_high"] - v["error_rate"]]],
            fmt="s",
            label=f"max_error_rate {v['max_error_rate']}",
        )
        ax.axvline(v["max_error_rate"], ls=":", lw=0.7, color="black")
    ax.set_xlabel("wrong-hit rate (wrong hits / queries)")
    ax.set_ylabel("hit rate")
    judge = result.get("embedder", "minilm")
    judge = "tuned" if isinstance(judge, dict) else judge
    ax.set_title(
        f"bench trust: {Path(result['pairs_file']).name}, {result['slice']} slice, {result['queries']} queries, {judge}",
        fontsize=8,
    )
    ax.legend(fontsize=6)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def _floats(text: str, name: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BenchInputError(f"{name} must be comma-separated numbers, got {text!r}") from None
    if not values or not all(0.0 < v < 1.0 for v in values):
        raise BenchInputError(f"{name} values must be between 0 and 1 (exclusive), got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pairs",
        type=Path,
        required=True,
        metavar="FILE.csv",
        help="labelled pairs (question1, question2, is_duplicate)",
    )
    parser.add_argument(
        "--max-error-rate",
        default=",".join(map(str, DEFAULT_DELTAS)),
        metavar="D1,D2,...",
        help="the δ values to run (semantic.max_error_rate)",
    )
    parser.add_argument(
        "--thresholds",
        default=",".join(map(str, DEFAULT_THRESHOLDS)),
        metavar="T1,T2,...",
        help="the static threshold sweep",
    )
    parser.add_argument(
        "--slice",
        choices=SLICES,
        default=None,
        help="usable rows: odd numbers = reported, even = tuning, or all "
        "(default: reported; all with --train-pairs, whose file is disjoint already)",
    )
    parser.add_argument(
        "--train-pairs",
        type=Path,
        default=None,
        metavar="FILE.csv",
        help="tune the embedder on these pairs (reused when already tuned on the same file; "
        "`kvgate tune --embedder`) and judge with it; the packaged MiniLM's static sweep "
        "is reported beside (make disjoint files with `kvgate tune --split`)",
    )
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="use the first N pairs of the slice")
    parser.add_argument("--seed", type=int, default=0, help="stream shuffle seed")
    parser.add_argument(
        "--tune-max-minutes",
        type=float,
        default=None,
        metavar="M",
        help="--train-pairs: the training's wall-clock budget (default 12)",
    )
    parser.add_argument(
        "--tune-max-steps", type=int, default=None, metavar="N", help="--train-pairs: cap training batches (quick runs)"
    )
    parser.add_argument(
        "--no-prior",
        action="store_true",
        help="--train-pairs: the δ runs without the tuned model's calibration prior "
        "(embedder.calibration_prior: false), to measure what it buys",
    )
    parser.add_argument("--embedder", choices=["minilm", "mpnet"], default="minilm", help="the judge (embedder.model)")
    parser.add_argument(
        "--store",
        choices=["local", "redis"],
        default="local",
        help="where the cache and the observations live (redis: a redis-server the run starts)",
    )
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="write the results here (JSON)")
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE.png", help="hit rate vs wrong-hit rate plot")


def main(args: argparse.Namespace) -> int:
    """Run and print a summary; 0 on success, 2 on bad input (message on stderr)."""
    from kvgate.index.responses.mpnet_files import MpnetMissing

    try:
        deltas = _floats(args.max_error_rate, "--max-error-rate")
        thresholds = _floats(args.thresholds, "--thresholds")
        if args.limit is not None and args.limit < 1:
            raise BenchInputError(f"--limit must be at least 1, got {args.limit}")
        which = args.slice or ("all" if args.train_pairs else "reported")
        result = run(
            args.pairs,
            deltas,
            thresholds,
            which,
            args.limit,
            args.seed,
            lambda m: print(m, file=sys.stderr, flush=True),
            args.embedder,
            args.store,
            args.train_pairs,
            {
                k: v
                for k, v in (("max_minutes", args.tune_max_minutes), ("max_steps", args.tune_max_steps))
                if v is not None
            },
            not args.no_prior,
        )
    except (BenchInputError, MpnetMissing) as exc:
        print(f"kvgate bench trust: error: {exc}", file=sys.stderr)
        return 2
    from kvgate.tools.bench.machine import machine_info

    result["machine"] = machine_info()
    write_json(args.json, result)
    if args.plot is not None:
        plot(result, args.plot)
    for best in result.get("minilm_best_static_within") or []:
        print(
            f"δ={best['max_error_rate']}: packaged MiniLM's best static within δ: t={best['threshold']} hit rate {best['hit_rate']:.4f}"
        )
    for best, v, top in zip(result["best_static_within"], result["verified"], result["ceiling"]["max_hit_rate_within"]):
        ratio = v["hit_rate"] / best["hit_rate"] if best["hit_rate"] else float("inf")
        print(
            f"δ={v['max_error_rate']}: verified hit rate {v['hit_rate']:.4f} wrong {v['error_rate']:.4f} "
            f"(95% ≤ {v['error_rate_ci_high']:.4f}); best static within δ: t={best['threshold']} "
            f"hit rate {best['hit_rate']:.4f} → ×{ratio:.2f}; no judge can pass {top['hit_rate']:.4f} here"
        )
    return 0
