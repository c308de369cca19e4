"""The --pairs run: every question1 into one scope of a SemanticIndex, every question2 looked up.

Two passes over the same index: a precision pass (question2 embedded in batches, then one top-1
search each; its scores give the threshold sweep) and a latency pass (one embedding + one search
per query, one at a time, after a warm-up). The run with the verifier (verified_run) reuses the
filled index; the GPTCache anchor (anchor_run) gets the same vectors.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from kvgate.tools.bench.machine import machine_info
from kvgate.tools.bench.semantic.anchor_run import anchor_result
from kvgate.tools.bench.semantic.report import progress
from kvgate.tools.bench.semantic.scoring import TopHit, score, top1_answers
from kvgate.tools.bench.semantic.verified_run import verified_result
from kvgate.tools.bench.stats import percentiles_ms
from kvgate.tools.tuning.candidates import embed_all
from kvgate.tools.tuning.pairs import BenchInputError, Pair, read_pairs

EMBED_BATCH = 1024
WARMUP_QUERIES = 20
SWEEP = tuple(round(0.70 + 0.02 * k, 2) for k in range(15))  # 0.70 .. 0.98
SCOPE = "qqp"


def embed_batched(embedder: Any, texts: list[str], label: str) -> np.ndarray:
    """Embed `texts` in batches of EMBED_BATCH with progress (tune's loop)."""
    return embed_all(embedder, texts, f"embedding {label}", EMBED_BATCH)


def holdout_pairs(pairs: list[Pair], limit: int | None) -> tuple[list[Pair], dict[str, int]]:
    """The held-out part of `pairs` under kvgate tune's split (first `limit`), and the part sizes."""
    from kvgate.tools.tuning.split import assign_parts

    parts = assign_parts([(p.question1, p.question2) for p in pairs])
    kept = [p for p, part in zip(pairs, parts) if part == "holdout"][:limit]
    if not kept:
        raise BenchInputError("--holdout: the held-out part of these pairs is empty")
    return kept, {part: parts.count(part) for part in ("train", "calib", "holdout")}


def load_pairs(path: Path, limit: int | None, holdout: bool) -> tuple[list[Pair], int, dict[str, int] | None]:
    """(pairs to run, rows skipped for an empty question, the split's part sizes with `holdout`)."""
    pairs, skipped = read_pairs(path, None if holdout else limit)
    if not holdout:
        return pairs, skipped, None
    kept, split = holdout_pairs(pairs, limit)
    return kept, skipped, split


def run_pairs(
    path: Path,
    threshold: float,
    limit: int | None,
    latency_queries: int,
    settings: Any = None,
    holdout: bool = False,
    verifier: bool = True,
    verifier_path: str | None = None,
) -> dict[str, Any]:
    """The whole --pairs benchmark; returns the JSON-ready result.

    `settings` (kvgate.middleware.cache.verification.SemanticSettings) is the route's operating point; without
    it the run with the verifier uses `threshold` and the config defaults for `verifier: true`.
    """
    from kvgate.index.responses.embedder import make_embedder
    from kvgate.index.responses.semantic import SemanticIndex

    started_all = time.perf_counter()
    pairs, skipped, split = load_pairs(path, limit, holdout)
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
            verified = verified_result(
                index, SCOPE, embedder, pairs, v2, threshold, settings, verifier, verifier_path, latency_texts, warmup
            )
        finally:
            index.close()
    progress(f"kvgate lookup latency over {len(latencies)} queries done")

    main_score = score(pairs, top, threshold)
    p50, p99 = percentiles_ms(latencies)
    notes = [
        f"embedder {embedder.name}; all question1 in one scope of a SemanticIndex ({index_kind} FAISS inner product)",
        "a hit is correct when top-1 is the pair's own entry and the pair is a duplicate, or another pair's entry "
        "whose question is the same text or linked by labelled duplicates (kvgate.tools.tuning.equivalence); "
        "recall counts correct hits on duplicate pairs",
        "precision pass: question2 embedded in batches, then one index.search(k=1) each; "
        "latency pass: one embed + one search per query, one at a time, after a warm-up of "
        f"{len(warmup)} queries",
        "precision is null when there are no hits",
    ]
    distinct_q1 = len(set(q1))
    if distinct_q1 < len(q1):
        notes.append(
            f"{len(q1) - distinct_q1} question1 texts repeat another pair's; a top-1 on the other copy counts as incorrect"
        )

    anchor = anchor_result(embedder, pairs, v1, v2, threshold, len(latency_texts), warmup, top1_answers(top, threshold))
    notes.extend([f"gptcache anchor skipped: {anchor['skipped']}"] if "skipped" in anchor else anchor["notes"])

    without = {k: main_score[k] for k in ("precision", "recall", "hits", "correct_hits")}
    without |= {
        "threshold": threshold,
        "pairs": len(pairs),
        "lookup_p50_ms": p50,
        "lookup_p99_ms": p99,
        "precision_95ci": _wilson(main_score["correct_hits"], main_score["hits"]),
    }
    return {
        "mode": "pairs",
        "pairs_file": str(path),
        "holdout": holdout,
        "split": split,
        "operating_point": describe_operating_point(settings, threshold),
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
    from kvgate.tools.tuning.calibrate import wilson_interval

    return wilson_interval(correct, hits)


def describe_operating_point(settings: Any, threshold: float) -> dict[str, Any]:
    """The JSON's operating_point: where the thresholds came from (--threshold or the route's settings)."""
    if settings is None:
        return {"source": "--threshold", "cosine_threshold": threshold}
    return {
        "source": settings.source,
        "cosine_threshold": settings.threshold,
        "verifier_threshold": settings.verifier_threshold,
        "candidates": settings.candidates,
    }
