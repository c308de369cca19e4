"""Scoring top-1 answers of the pairs benchmark: hits, correct hits, precision, recall (pure).

The same code scores kvgate (top-1 with its similarity, so a threshold sweep comes from one
search pass) and any cache that only says which pair answered (GPTCache).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from kvgate.tools.tuning.equivalence import Equivalence, credited
from kvgate.tools.tuning.pairs import Pair


@dataclass(frozen=True)
class TopHit:
    """Top-1 answer to one query: which pair's entry came back, and how similar it was."""

    pair: int
    similarity: float


def score(pairs: Sequence[Pair], top: Sequence[TopHit | None], threshold: float) -> dict[str, Any]:
    """Hits, correct hits, precision and recall of top-1 answers at `threshold`.

    `top[i]` is the answer to pair i's question2 (None: the index returned nothing); it is a hit when
    its similarity reaches the threshold. A hit is correct when kvgate.tools.tuning.equivalence credits it
    (the pair's own entry of a duplicate pair, or an entry the labels link to the question).
    Invariants: correct_hits <= hits; raising the threshold never adds hits; precision is None
    without hits, recall None without duplicate pairs.
    """
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


def top1_answers(top: Sequence[TopHit | None], threshold: float) -> list[int | None]:
    """Which pair answered each query at `threshold` (None: no hit), comparable to another cache's."""
    return [t.pair if t is not None and t.similarity >= threshold else None for t in top]
