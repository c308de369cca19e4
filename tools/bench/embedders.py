"""`kvgate bench embedders`: MiniLM vs mpnet as the judge of labelled pairs, in one run.

Per embedder, on the same pairs (the reported slice of tools/bench/trust_stream.py unless told):
pair AUC of the cosine of question1 and question2 against is_duplicate (the probability that a
duplicate pair scores above a non-duplicate one, ties half), the best recall at precision ≥ 0.9
and ≥ 0.95 over all cosine thresholds, and per-query embedding latency (one question per call,
the proxy's case; the two embedders interleaved question by question, so both see the same load).
Pair embeddings go through the benchmark embedding cache (tools/bench/embed_cache.py); latency is
always measured afresh.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kvgate.tools.bench.stats import percentiles_ms, write_json
from kvgate.tools.bench.trust_stream import SLICES, slice_pairs
from kvgate.tools.tuning.pairs import BenchInputError, read_pairs

MODELS = ("minilm", "mpnet")


def pair_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney AUC: P(score of a positive > score of a negative), ties counted half.
    Invariant: in [0, 1]; 1 - AUC for negated scores; NaN without both classes."""
    pos, neg = scores[labels], scores[~labels]
    if not len(pos) or not len(neg):
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    ranks[order] = np.arange(1, len(order) + 1)
    values = np.concatenate([pos, neg])
    for v in np.unique(values):  # average ranks of ties
        same = values == v
        ranks[same] = ranks[same].mean()
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def recall_at_precision(scores: np.ndarray, labels: np.ndarray, target: float) -> tuple[float, float | None]:
    """(best recall, its threshold) over thresholds t (predict duplicate when score ≥ t) whose
    precision is ≥ target; (0.0, None) when none is. Ties are kept together."""
    order = np.argsort(-scores, kind="mergesort")
    s, y = scores[order], labels[order]
    tp = np.cumsum(y)
    n = np.arange(1, len(y) + 1)
    last_of_tie = np.append(s[1:] != s[:-1], True)
    ok = last_of_tie & (tp / n >= target)
    if not ok.any() or not y.any():
        return 0.0, None
    best = int(np.argmax(np.where(ok, tp, -1)))
    return float(tp[best] / y.sum()), float(s[best])


def run(
    path: Path, which: str, limit: int | None, latency_queries: int, progress: Callable[[str], None] = lambda _m: None
) -> dict[str, Any]:
    from kvgate.index.responses.embedder import make_embedder
    from kvgate.tools.bench.embed_cache import cache_key, cached_embeddings

    pairs = slice_pairs(read_pairs(path, None)[0], which)[:limit]
    labels = np.array([p.duplicate for p in pairs])
    texts = [p.question1 for p in pairs] + [p.question2 for p in pairs]
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()
    embedders = {m: make_embedder("onnx", model=m) for m in MODELS}
    out: dict[str, Any] = {}
    for model, embedder in embedders.items():
        vecs, cache = cached_embeddings(texts, embedder, cache_key(digest, embedder.name), progress)
        scores = np.einsum("ij,ij->i", vecs[: len(pairs)], vecs[len(pairs) :])
        r90, t90 = recall_at_precision(scores, labels, 0.9)
        r95, t95 = recall_at_precision(scores, labels, 0.95)
        out[model] = {
            "dim": embedder.dim,
            "pair_auc": round(pair_auc(scores, labels), 4),
            "recall_at_precision_0.9": round(r90, 4),
            "threshold_0.9": t90,
            "recall_at_precision_0.95": round(r95, 4),
            "threshold_0.95": t95,
            "embedding_cache": cache.state,
        }
        progress(f"{model}: AUC {out[model]['pair_auc']}, recall@P0.9 {r90:.3f}, recall@P0.95 {r95:.3f}")
    samples: dict[str, list[float]] = {m: [] for m in MODELS}
    for question in [p.question2 for p in pairs[:latency_queries]]:
        for model, embedder in embedders.items():
            started = time.perf_counter()
            embedder.embed([question])
            samples[model].append(time.perf_counter() - started)
    for model in MODELS:
        out[model]["query_ms_p50"], out[model]["query_ms_p99"] = percentiles_ms(samples[model])
    return {
        "mode": "embedders",
        "pairs_file": str(path),
        "slice": which,
        "pairs": len(pairs),
        "duplicates": int(labels.sum()),
        "latency_queries": min(latency_queries, len(pairs)),
        "models": out,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pairs", type=Path, required=True, metavar="FILE.csv")
    parser.add_argument("--slice", choices=SLICES, default="reported", help="as in `kvgate bench trust`")
    parser.add_argument(
        "--limit", type=int, default=1000, metavar="N", help="first N pairs of the slice (default 1000)"
    )
    parser.add_argument("--latency-queries", type=int, default=200, metavar="N")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT")


def main(args: argparse.Namespace) -> int:
    from kvgate.index.responses.mpnet_files import MpnetMissing
    from kvgate.tools.bench.machine import machine_info

    try:
        if args.limit < 1 or args.latency_queries < 1:
            raise BenchInputError("--limit and --latency-queries must be at least 1")
        result = run(
            args.pairs, args.slice, args.limit, args.latency_queries, lambda m: print(m, file=sys.stderr, flush=True)
        )
    except (BenchInputError, MpnetMissing) as exc:
        print(f"kvgate bench embedders: error: {exc}", file=sys.stderr)
        return 2
    result["machine"] = machine_info()
    write_json(args.json, result)
    for model, row in result["models"].items():
        print(
            f"{model}: AUC {row['pair_auc']} recall@P0.9 {row['recall_at_precision_0.9']} "
            f"recall@P0.95 {row['recall_at_precision_0.95']} query p50 {row['query_ms_p50']} ms"
        )
    return 0
