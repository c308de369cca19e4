"""Operating points: which (cosine threshold, verifier threshold) serves hits at a precision target.

The setting is the cache's own: each pair's question1 is a cached entry, each question2 a lookup
that sees its top-k entries by cosine. A lookup's outcome at (c, v) is decided by `serve` (the
same rule the pipeline applies, kvgate.middleware.cache.verification.choose); whether it is correct is decided
by kvgate.tools.tuning.equivalence.credited (the pair's own entry by its label; another pair's entry
when its question is the same text or labelled duplicates link the two). Precision = correct /
hits, recall = correct hits on duplicate pairs / duplicates.

`sweep` scores every grid point in one vectorised pass; `pick` takes the point with the best
recall whose precision meets the target on at least `min_hits` hits.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

COSINE_GRID = tuple(round(0.50 + 0.01 * k, 2) for k in range(50))  # 0.50 .. 0.99
VERIFIER_GRID_SIZE = 200
MIN_HITS = 50  # fewer hits make a precision estimate too noisy to promise


@dataclass(frozen=True)
class Candidates:
    """Top-k search results per lookup. Shapes (n, k); -1 / nan pad lookups with fewer results."""

    entry: np.ndarray  # int: the pair index whose question1 came back
    cosine: np.ndarray  # float32
    prob: np.ndarray  # float32 verifier probability (nan where not scored)
    duplicate: np.ndarray  # bool, (n,): the lookup's pair is a duplicate
    credit: np.ndarray | None = None  # (n, k) bool: serving this candidate is correct (equivalence.credited)

    @property
    def correct(self) -> np.ndarray:
        """(n, k) bool: serving this candidate is correct (without `credit`: it is the lookup's
        own entry and the pair is a duplicate)."""
        if self.credit is not None:
            return self.credit
        own = self.entry == np.arange(len(self.entry))[:, None]
        return own & self.duplicate[:, None]


@dataclass(frozen=True)
class Point:
    cosine_threshold: float
    verifier_threshold: float | None  # None: no verifier (top-1 by cosine)
    hits: int
    correct_hits: int
    precision: float | None
    recall: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def wilson_interval(correct: int, total: int, z: float = 1.96) -> tuple[float, float] | None:
    """95% Wilson score interval of a proportion; None for an empty sample."""
    if total == 0:
        return None
    p = correct / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return round(centre - half, 4), round(centre + half, 4)


def _point(c: float, v: float | None, hits: int, correct: int, duplicates: int, answered: int | None = None) -> Point:
    """`answered`: correct hits on duplicate pairs (the recall numerator; default `correct`)."""
    answered = correct if answered is None else answered
    return Point(
        round(float(c), 4),
        None if v is None else round(float(v), 6),
        int(hits),
        int(correct),
        round(float(correct) / hits, 4) if hits else None,
        round(float(answered) / duplicates, 4) if duplicates else None,
    )


def verifier_grid(prob: np.ndarray, size: int = VERIFIER_GRID_SIZE) -> np.ndarray:
    """Candidate verifier thresholds: quantiles of the observed probabilities (plus 0.5), sorted."""
    seen = prob[np.isfinite(prob)]
    if seen.size == 0:
        return np.array([0.5])
    qs = np.quantile(seen, np.linspace(0.0, 1.0, size))
    return np.unique(np.concatenate([qs, [0.5]]))


def sweep(c: Candidates, cosine_grid: Sequence[float] = COSINE_GRID, with_verifier: bool = True) -> list[Point]:
    """Every grid point's hits/precision/recall. Without verifier: top-1 by cosine only."""
    duplicates = int(c.duplicate.sum())
    correct = c.correct
    dup = c.duplicate
    cos = np.nan_to_num(c.cosine, nan=-2.0)
    out: list[Point] = []
    if not with_verifier:
        for t in cosine_grid:
            ok = (cos[:, 0] >= t) & correct[:, 0]
            out.append(_point(t, None, (cos[:, 0] >= t).sum(), ok.sum(), duplicates, (ok & dup).sum()))
        return out
    prob = np.nan_to_num(c.prob, nan=-1.0)
    grid = verifier_grid(c.prob)  # from the scored candidates only (nan = not scored)
    rows = np.arange(len(cos))
    for t in cosine_grid:
        passed = cos >= t
        ranked = np.where(passed, prob, -1.0)
        best = ranked.argmax(axis=1)  # the candidate the pipeline would serve (highest verifier score)
        best_prob = ranked[rows, best]
        best_correct = correct[rows, best]
        for v in grid:
            hit = best_prob >= v
            ok = hit & best_correct
            out.append(_point(t, v, hit.sum(), ok.sum(), duplicates, (ok & dup).sum()))
    return out


def pick(points: Sequence[Point], target: float, min_hits: int = MIN_HITS) -> Point | None:
    """Best recall among points with precision ≥ target and ≥ min_hits hits (ties: higher
    precision, then higher thresholds); None when no point qualifies."""
    ok = [p for p in points if p.precision is not None and p.hits >= min_hits and p.precision >= target]
    if not ok:
        return None
    return max(ok, key=lambda p: (p.recall or 0.0, p.precision or 0.0, p.cosine_threshold, p.verifier_threshold or 0.0))


def evaluate(c: Candidates, cosine_threshold: float, verifier_threshold: float | None) -> Point:
    """One operating point scored on `c` (e.g. the held-out part)."""
    return (
        sweep(c, [cosine_threshold], with_verifier=False)[0]
        if verifier_threshold is None
        else _at(c, cosine_threshold, verifier_threshold)
    )


def _at(c: Candidates, t: float, v: float) -> Point:
    cos = np.nan_to_num(c.cosine, nan=-2.0)
    prob = np.nan_to_num(c.prob, nan=-1.0)
    rows = np.arange(len(cos))
    ranked = np.where(cos >= t, prob, -1.0)
    best = ranked.argmax(axis=1)
    hit = ranked[rows, best] >= v
    ok = hit & c.correct[rows, best]
    return _point(t, v, hit.sum(), ok.sum(), int(c.duplicate.sum()), (ok & c.duplicate).sum())


def curve(
    points: Sequence[Point], levels: Sequence[float] = (0.8, 0.85, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99)
) -> list[dict[str, Any]]:
    """Precision/recall curve: for each precision level, the best recall reaching it."""
    out = []
    for level in levels:
        best = pick(points, level, min_hits=1)
        out.append({"precision_at_least": level, **(best.as_dict() if best else {"recall": 0.0, "hits": 0})})
    return out
