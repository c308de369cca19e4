"""`kvgate bench semantic`: semantic-cache precision/recall vs GPTCache, and proxy latency at size.

Two modes, one required:

* `--pairs FILE.csv` (columns question1, question2, is_duplicate): every question1 goes into one
  scope of a SemanticIndex, every question2 is looked up (top-1). A hit (similarity >= threshold)
  is correct when it returns that pair's own entry and the pair is a duplicate, or another pair's
  entry whose question is the same text or linked to the new one by labelled duplicates (never
  when the file labels the two non-duplicate; tools.tuning.equivalence);
  precision = correct hits / hits, recall = correct hits on duplicate pairs / duplicate pairs. A threshold sweep comes
  from the same top-1 results. Lookup latency (one embedding + one search, one query at a time)
  is measured on the first --latency-queries question2. GPTCache runs on the same pairs with the
  same embedder (tools.bench.gptcache_anchor) and is scored by the same code.
* `--entries N`: proxy-level latency with N entries in the scope (tools.bench.proxy_latency).

Results go to --json (indent 2); a summary table goes to stdout, progress to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tools.bench.stats import percentiles_ms
from tools.tuning.pairs import BenchInputError, Pair, read_pairs  # noqa: F401  (re-exported: tests, kvgate tune)

DEFAULT_PAIRS_THRESHOLD = 0.9
DEFAULT_PROXY_THRESHOLD = 0.8
DEFAULT_LATENCY_QUERIES = 1000
DEFAULT_PROXY_QUERIES = 300
EMBED_BATCH = 1024
WARMUP_QUERIES = 20
SWEEP = tuple(round(0.70 + 0.02 * k, 2) for k in range(15))  # 0.70 .. 0.98
SCOPE = "qqp"


@dataclass(frozen=True)
class TopHit:
    """Top-1 answer to one query: which pair's entry came back, and how similar it was."""

    pair: int
    similarity: float


# ------------------------------------------------------------------------------------------ CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `kvgate bench semantic`."""
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--pairs", type=Path, metavar="FILE.csv",
                      help="precision/recall mode: CSV with columns question1,question2,is_duplicate")
    mode.add_argument("--entries", type=int, metavar="N",
                      help="proxy latency mode: pre-fill the scope with N entries, then time requests")
    parser.add_argument("--json", type=Path, metavar="OUT", default=None, help="write the results here (JSON)")
    parser.add_argument("--threshold", type=float, default=None,
                        help=f"cosine similarity for a hit (default {DEFAULT_PAIRS_THRESHOLD} with --pairs, "
                             f"{DEFAULT_PROXY_THRESHOLD} with --entries)")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="--pairs: use the first N usable pairs")
    parser.add_argument("--latency-queries", type=int, default=None, metavar="N",
                        help=f"--pairs: time the first N lookups one at a time (default {DEFAULT_LATENCY_QUERIES})")
    parser.add_argument("--queries", type=int, default=None, metavar="N",
                        help=f"--entries: exact and semantic requests to time (default {DEFAULT_PROXY_QUERIES})")
    parser.add_argument("--route", default=None, metavar="NAME",
                        help="--pairs: use this route's operating point (its tuned point with target_precision, "
                             "from --config's cache_dir, else ./.kvgate) instead of --threshold")
    parser.add_argument("--config", type=Path, default=None, metavar="CONFIG", help="--pairs: config holding --route")
    parser.add_argument("--holdout", action="store_true",
                        help="--pairs: evaluate only the held-out part of the deterministic split `kvgate tune` uses")
    parser.add_argument("--no-verifier", action="store_true", help="--pairs: skip the run with the verifier")


def main(args: argparse.Namespace) -> int:
    """Run the chosen mode; 0 on success, 2 on bad input (message on stderr)."""
    try:
        if args.pairs is not None:
            result = run_pairs(**_pairs_options(args))
            print_pairs_summary(result)
        else:
            result = run_proxy(**_proxy_options(args))
            print_proxy_summary(result)
    except BenchInputError as exc:
        print(f"kvgate bench semantic: error: {exc}", file=sys.stderr)
        return 2
    if args.json is not None:
        write_json(args.json, result)
        print(f"results written to {args.json}")
    return 0


def _reject_other_mode(args: argparse.Namespace, names: Sequence[str], mode: str) -> None:
    given = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n, None) is not None]
    if given:
        raise BenchInputError(f"{', '.join(given)} only applies to the other mode, not {mode}")


def _check_threshold(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise BenchInputError(f"--threshold must be between 0 and 1, got {value}")
    return value


def _pairs_options(args: argparse.Namespace) -> dict[str, Any]:
    _reject_other_mode(args, ["queries"], "--pairs")
    if args.limit is not None and args.limit < 1:
        raise BenchInputError(f"--limit must be at least 1, got {args.limit}")
    latency = DEFAULT_LATENCY_QUERIES if args.latency_queries is None else args.latency_queries
    if latency < 1:
        raise BenchInputError(f"--latency-queries must be at least 1, got {latency}")
    settings, verifier_path = _route_settings(args)
    threshold = settings.threshold if settings else DEFAULT_PAIRS_THRESHOLD if args.threshold is None else args.threshold
    return {"path": args.pairs, "threshold": _check_threshold(threshold), "limit": args.limit, "latency_queries": latency,
            "settings": settings, "holdout": args.holdout, "verifier": not args.no_verifier, "verifier_path": verifier_path}


def _route_settings(args: argparse.Namespace) -> tuple[Any, str | None]:
    """(SemanticSettings of --route or None, the configured verifier dir or None)."""
    from middleware.config import Config, RouteConfig, load_config
    from middleware.errors import ConfigError
    from middleware.verification import resolve

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
    if args.holdout or args.no_verifier:
        raise BenchInputError("--holdout and --no-verifier only apply to --pairs")
    if args.entries < 0:
        raise BenchInputError(f"--entries must be 0 or more, got {args.entries}")
    queries = DEFAULT_PROXY_QUERIES if args.queries is None else args.queries
    if queries < 1:
        raise BenchInputError(f"--queries must be at least 1, got {queries}")
    threshold = DEFAULT_PROXY_THRESHOLD if args.threshold is None else args.threshold
    return {"entries": args.entries, "queries": queries, "threshold": _check_threshold(threshold)}


# ------------------------------------------------------------------------------------------ helpers
def progress(message: str) -> None:
    """One progress line on stderr (stdout keeps the summary)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def machine_info() -> dict[str, Any]:
    """Where the figures were taken, and how busy the machine was (latencies depend on it)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        load = None
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "load_average_1_5_15m": load,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write `data` as indented JSON, creating parent directories."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


# ------------------------------------------------------------------------------------------ scoring
def score(pairs: Sequence[Pair], top: Sequence[TopHit | None], threshold: float) -> dict[str, Any]:
    """Hits, correct hits, precision and recall of top-1 answers at `threshold`.

    `top[i]` is the answer to pair i's question2 (None: the index returned nothing); it is a hit when
    its similarity reaches the threshold. precision is None without hits, recall None without duplicates.
    """
    from tools.tuning.equivalence import Equivalence, credited

    q1, q2, dup = [p.question1 for p in pairs], [p.question2 for p in pairs], [p.duplicate for p in pairs]
    eq = Equivalence(zip(q1, q2, dup))
    duplicates = sum(dup)
    hits = correct = answered = 0
    for i, found in enumerate(top):
        if found is None or found.similarity < threshold:
            continue
        hits += 1
        if credited(i, found.pair, q1, q2, dup, eq):
            correct += 1
            answered += dup[i]
    return {
        "threshold": threshold,
        "hits": hits,
        "correct_hits": correct,
        "precision": round(correct / hits, 4) if hits else None,
        "recall": round(answered / duplicates, 4) if duplicates else None,
    }


def score_returned(pairs: Sequence[Pair], returned: Sequence[int | None]) -> dict[str, Any]:
    """The same scoring for a cache that only says which pair answered (None = miss): every
    answer it returned is a hit, so it is scored as a top-1 of similarity 1 at threshold 1."""
    top = [TopHit(r, 1.0) if r is not None else None for r in returned]
    out = score(pairs, top, 1.0)
    del out["threshold"]
    return out


# ------------------------------------------------------------------------------------------ pairs mode
def embed_batched(embedder: Any, texts: Sequence[str], label: str) -> np.ndarray:
    """Embed `texts` in batches of EMBED_BATCH with progress lines."""
    out = np.empty((len(texts), embedder.dim), dtype=np.float32)
    started = time.perf_counter()
    for start in range(0, len(texts), EMBED_BATCH):
        chunk = texts[start : start + EMBED_BATCH]
        out[start : start + len(chunk)] = embedder.embed(chunk)
        progress(f"embedded {start + len(chunk)}/{len(texts)} {label} ({time.perf_counter() - started:.1f}s)")
    return out


def holdout_pairs(pairs: list[Pair], limit: int | None) -> tuple[list[Pair], dict[str, int]]:
    """The held-out part of `pairs` under kvgate tune's split (first `limit`), and the part sizes."""
    from tools.tuning.split import assign_parts

    parts = assign_parts([(p.question1, p.question2) for p in pairs])
    kept = [p for p, part in zip(pairs, parts) if part == "holdout"][:limit]
    if not kept:
        raise BenchInputError("--holdout: the held-out part of these pairs is empty")
    return kept, {part: parts.count(part) for part in ("train", "calib", "holdout")}


def run_pairs(path: Path, threshold: float, limit: int | None, latency_queries: int, settings: Any = None,
              holdout: bool = False, verifier: bool = True, verifier_path: str | None = None) -> dict[str, Any]:
    """The whole --pairs benchmark; returns the JSON-ready result.

    `settings` (middleware.verification.SemanticSettings) is the route's operating point; without
    it the run with the verifier uses `threshold` and the config defaults for `verifier: true`.
    """
    from index.embedder import make_embedder
    from index.semantic import SemanticIndex
    from tools.bench.gptcache_anchor import require_gptcache, run_gptcache

    started_all = time.perf_counter()
    pairs, skipped = read_pairs(path, None if holdout else limit)
    split = None
    if holdout:
        pairs, split = holdout_pairs(pairs, limit)
    duplicates = sum(p.duplicate for p in pairs)
    progress(f"{len(pairs)} pairs ({duplicates} duplicates) from {path}; loading the embedder")
    embedder = make_embedder("onnx")
    q1 = [p.question1 for p in pairs]
    q2 = [p.question2 for p in pairs]
    v1 = embed_batched(embedder, q1, "question1")
    v2 = embed_batched(embedder, q2, "question2")
    latency_texts = q2[:latency_queries]
    warmup = q1[-WARMUP_QUERIES:]

    with tempfile.TemporaryDirectory(prefix="kvgate-bench-semantic-") as tmp:
        index = SemanticIndex(Path(tmp) / "index", embedder.dim, max_entries=len(pairs) + 1)
        try:
            index.add_many_vectors(SCOPE, [({"pair": i}, q1[i], v1[i]) for i in range(len(pairs))])
            index_kind = "hnsw" if len(pairs) > index.hnsw_above else "flat"
            top: list[TopHit | None] = []
            search_started = time.perf_counter()
            for i in range(len(pairs)):
                found = index.search(SCOPE, v2[i], k=1)
                top.append(TopHit(int(found[0][0].response["pair"]), float(found[0][1])) if found else None)
            progress(f"searched {len(pairs)} question2 in {time.perf_counter() - search_started:.1f}s")

            for text in warmup:
                index.search(SCOPE, embedder.embed([text])[0], k=1)
            latencies: list[float] = []
            for text in latency_texts:
                t0 = time.perf_counter()
                index.search(SCOPE, embedder.embed([text])[0], k=1)
                latencies.append(time.perf_counter() - t0)
            verified = _verified_run(index, embedder, pairs, v2, threshold, settings, verifier, verifier_path,
                                     latency_texts, warmup)
        finally:
            index.close()
    progress(f"kvgate lookup latency over {len(latencies)} queries done")

    main_score = score(pairs, top, threshold)
    p50, p99 = percentiles_ms(latencies)
    notes = [
        f"embedder {embedder.name}; all question1 in one scope of a SemanticIndex ({index_kind} FAISS inner product)",
        "a hit is correct when top-1 is the pair's own entry and the pair is a duplicate, or another pair's entry "
        "whose question is the same text or linked by labelled duplicates (tools.tuning.equivalence); "
        "recall counts correct hits on duplicate pairs",
        "precision pass: question2 embedded in batches, then one index.search(k=1) each; "
        "latency pass: one embed + one search per query, one at a time, after a warm-up of "
        f"{len(warmup)} queries",
        "precision is null when there are no hits",
    ]
    distinct_q1 = len(set(q1))
    if distinct_q1 < len(q1):
        notes.append(f"{len(q1) - distinct_q1} question1 texts repeat another pair's; "
                     "a top-1 on the other copy counts as incorrect")

    anchor: dict[str, Any]
    reason = require_gptcache()
    if reason is not None:
        anchor = {"skipped": reason}
        notes.append(f"gptcache anchor skipped: {reason}")
    else:
        progress("gptcache anchor: same embedder, sqlite + faiss stores")
        run = run_gptcache(embedder, q1, q2, v1, v2, threshold, len(latency_texts), warmup, progress)
        g50, g99 = percentiles_ms(run.latencies_s)
        ours = [t.pair if t is not None and t.similarity >= threshold else None for t in top]
        anchor = {
            "threshold": threshold,
            "gptcache_similarity_threshold": round(run.similarity_threshold, 6),
            "max_distance": run.max_distance,
            **score_returned(pairs, run.returned),
            "pairs": len(pairs),
            "lookup_p50_ms": g50,
            "lookup_p99_ms": g99,
            "latency_queries": len(run.latencies_s),
            "same_answer_as_kvgate": sum(a == b for a, b in zip(ours, run.returned)),
            "settings": run.settings,
            "notes": run.notes,
        }
        notes.extend(run.notes)

    without = {k: main_score[k] for k in ("precision", "recall", "hits", "correct_hits")}
    without |= {"threshold": threshold, "pairs": len(pairs), "lookup_p50_ms": p50, "lookup_p99_ms": p99,
                "precision_95ci": _wilson(main_score["correct_hits"], main_score["hits"])}
    return {
        "mode": "pairs",
        "pairs_file": str(path),
        "holdout": holdout,
        "split": split,
        "operating_point": _describe(settings, threshold),
        "with_verifier": verified,
        "without_verifier": without,
        "pairs": len(pairs),
        "duplicates": duplicates,
        "skipped_rows": skipped,
        "threshold": threshold,
        "precision": main_score["precision"],
        "recall": main_score["recall"],
        "hits": main_score["hits"],
        "correct_hits": main_score["correct_hits"],
        "top1_own_entry": sum(t is not None and t.pair == i for i, t in enumerate(top)),
        "lookup_p50_ms": p50,
        "lookup_p99_ms": p99,
        "latency_queries": len(latencies),
        "index_kind": index_kind,
        "embedder": embedder.name,
        "sweep": [score(pairs, top, t) for t in SWEEP],
        "gptcache": anchor,
        "duration_s": round(time.perf_counter() - started_all, 2),
        "machine": machine_info(),
        "notes": notes,
    }


def _wilson(correct: int, hits: int) -> Any:
    from tools.tuning.calibrate import wilson_interval

    return wilson_interval(correct, hits)


def _describe(settings: Any, threshold: float) -> dict[str, Any]:
    if settings is None:
        return {"source": "--threshold", "cosine_threshold": threshold}
    return {"source": settings.source, "cosine_threshold": settings.threshold,
            "verifier_threshold": settings.verifier_threshold, "candidates": settings.candidates}


def _verified_run(index: Any, embedder: Any, pairs: list[Pair], v2: np.ndarray, threshold: float, settings: Any,
                  enabled: bool, verifier_path: str | None, latency_texts: list[str], warmup: list[str]) -> dict[str, Any]:
    """The same lookups with the verifier (tools.bench.verified), or why it was skipped."""
    from index.verifier import VerifierMissing, load_verifier
    from tools.bench.verified import run_verified
    from middleware.config import SemanticConfig
    from middleware.verification import SemanticSettings

    if not enabled:
        return {"skipped": "--no-verifier"}
    if settings is None or not settings.verifies:  # the defaults of a route with `verifier: true`
        defaults = SemanticConfig()
        settings = SemanticSettings(threshold, defaults.verifier_threshold, defaults.candidates, "config defaults")
    try:
        verifier = load_verifier(verifier_path)
    except VerifierMissing as exc:
        return {"skipped": str(exc)}
    progress(f"with the verifier {verifier.name}: cosine >= {settings.threshold}, "
             f"verifier >= {settings.verifier_threshold}, top-{settings.candidates}")
    return run_verified(index, SCOPE, embedder, verifier, [p.question1 for p in pairs], [p.question2 for p in pairs],
                        [p.duplicate for p in pairs], v2, settings, latency_texts, warmup, progress)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def print_pairs_summary(result: dict[str, Any]) -> None:
    """A short table: kvgate vs GPTCache at the threshold, then the sweep."""
    print(f"semantic cache on {result['pairs']} pairs ({result['duplicates']} duplicates), "
          f"cosine threshold {result['threshold']}")
    rows = [("kvgate", result)]
    if "skipped" not in result["with_verifier"]:
        rows.append(("+verifier", result["with_verifier"]))
    if "skipped" not in result["gptcache"]:
        rows.append(("gptcache", result["gptcache"]))
    print(f"{'cache':<10}{'precision':>10}{'recall':>9}{'hits':>7}{'correct':>9}{'p50 ms':>9}{'p99 ms':>9}")
    for name, r in rows:
        print(f"{name:<10}{_fmt(r['precision']):>10}{_fmt(r['recall']):>9}{r['hits']:>7}{r['correct_hits']:>9}"
              f"{_fmt(r['lookup_p50_ms']):>9}{_fmt(r['lookup_p99_ms']):>9}")
    if "skipped" in result["gptcache"]:
        print(f"gptcache: skipped ({result['gptcache']['skipped']})")
    if "skipped" in result["with_verifier"]:
        print(f"+verifier: skipped ({result['with_verifier']['skipped']})")
    else:
        v = result["with_verifier"]
        print(f"+verifier: cosine >= {v['threshold']}, verifier >= {_fmt(v['verifier_threshold'])}, top-{v['candidates']}; "
              "precision/recall over verifier thresholds at this cosine threshold (not tuned on these pairs):")
        print("  " + "  ".join(f"P>={r['precision_at_least']}: R={_fmt(r.get('recall'))}"
                               for r in v["curve_at_this_cosine_threshold"]))
    print("sweep (kvgate):  threshold  precision  recall  hits")
    for s in result["sweep"]:
        print(f"{'':16}{s['threshold']:>9.2f}{_fmt(s['precision']):>11}{_fmt(s['recall']):>8}{s['hits']:>6}")


# ------------------------------------------------------------------------------------------ proxy mode
def run_proxy(entries: int, queries: int, threshold: float) -> dict[str, Any]:
    """The --entries benchmark (tools.bench.proxy_latency) plus machine info."""
    from tools.bench.proxy_latency import run_proxy_latency

    result = run_proxy_latency(entries, queries, threshold, progress)
    result["machine"] = machine_info()
    return result


def print_proxy_summary(result: dict[str, Any]) -> None:
    """A short table of the proxy latencies."""
    print(f"proxy latency with {result['scope_entries']} entries in the scope ({result['index_kind']} index), "
          f"threshold {result['threshold']}")
    print(f"{'request':<22}{'count':>12}{'p50 ms':>9}{'p99 ms':>9}")
    lines = [
        ("miss (seed)", f"{result['seed_misses']}/{result['seeded']}", result["miss_p50_ms"], result["miss_p99_ms"]),
        ("exact hit", f"{result['exact_hits']}/{result['exact_requests']}", result["exact_hit_p50_ms"], result["exact_hit_p99_ms"]),
        ("semantic hit", f"{result['semantic_hits']}/{result['semantic_requests']}", result["semantic_hit_p50_ms"], result["semantic_hit_p99_ms"]),
        ("backend direct", str(result["queries"]), result["backend_direct_p50_ms"], result["backend_direct_p99_ms"]),
    ]
    for name, count, p50, p99 in lines:
        print(f"{name:<22}{count:>12}{_fmt(p50):>9}{_fmt(p99):>9}")
    print(f"semantic hits returning the right seed's answer: {result['semantic_hits_correct']}/{result['semantic_hits']}")
