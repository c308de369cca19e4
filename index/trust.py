"""The decision rule of `semantic.max_error_rate` (verified semantic caching, after vCache): pure
functions, no I/O.

A semantic candidate at cosine similarity `s` is served only when an *upper confidence bound* on
the probability that its answer is wrong is small enough. That bound comes from verified
observations `(similarity, correct?)`: explorations (the backend's fresh answer compared with the
cached one) and feedback. The model is vCache's: P(correct | s) = σ(a·s + b) (a logistic curve
whose midpoint t = -b/a is the entry's threshold), fitted by penalised maximum likelihood, with
a one-sided bound on the logit from the fit's covariance (the delta method). With no data the
bound is ~1 (never served); a lookup table would need no curve where the data separate, but the
small ridge penalty already keeps a separable fit finite, and its covariance keeps it honest.

How much of the error budget a route may spend is `budget_cutoff`: the route serves candidates
whose bound is at most π, the largest value for which the bounds of the recent lookups at or
below π sum to at most δ per lookup (water-filling: the budget buys the safest hits first).
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

Z_95 = 1.6448536269514722  # one-sided 95% normal quantile
RIDGE = 0.5  # penalty on both coefficients of the centred, scaled fit: keeps separable data finite
CENTRE, SCALE = 0.85, 10.0  # u = (s - CENTRE) * SCALE: cosine similarities live in a narrow band


@dataclass(frozen=True)
class Observation:
    """One verified outcome: a query at `similarity` to an entry got a correct (or wrong) answer."""

    similarity: float
    correct: bool


@dataclass(frozen=True)
class Rule:
    """A fitted logistic P(correct | s) = σ(coef[0]·u + coef[1]), u = (s - CENTRE)·SCALE, with the
    inverse penalised Fisher information `cov` (2x2) for its confidence bound; n observations."""

    coef: tuple[float, float]
    cov: tuple[tuple[float, float], tuple[float, float]]
    n: int

    @property
    def threshold(self) -> float:
        """The midpoint t (P(correct | t) = 0.5) in similarity units; inf when the fit is flat."""
        a, b = self.coef
        return CENTRE - b / (a * SCALE) if a > 1e-9 else math.inf


def _sigmoid(x: np.ndarray | float) -> np.ndarray | float:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -50.0, 50.0)))


def fit_rule(observations: Sequence[Observation], iterations: int = 25) -> Rule:
    """Penalised logistic fit by Newton's method (ridge RIDGE on both coefficients).

    Invariant: always returns finite coefficients and a positive-definite covariance, for any
    input (none, one class only, separable, contradictory); with no observations the fit is the
    prior (coef 0, cov I/RIDGE)."""
    u = np.array([(o.similarity - CENTRE) * SCALE for o in observations], dtype=np.float64)
    y = np.array([1.0 if o.correct else 0.0 for o in observations], dtype=np.float64)
    x = np.stack([u, np.ones_like(u)], axis=1) if len(u) else np.zeros((0, 2))
    w = np.zeros(2)
    penalty = RIDGE * np.eye(2)
    for _ in range(iterations):
        p = _sigmoid(x @ w)
        grad = x.T @ (y - p) - RIDGE * w
        hess = (x * (p * (1 - p))[:, None]).T @ x + penalty
        step = np.linalg.solve(hess, grad)
        w = w + step
        if float(np.abs(step).max(initial=0.0)) < 1e-8:
            break
    p = _sigmoid(x @ w)
    info = (x * (p * (1 - p))[:, None]).T @ x + penalty
    cov = np.linalg.inv(info)
    return Rule((float(w[0]), float(w[1])), ((float(cov[0, 0]), float(cov[0, 1])), (float(cov[1, 0]), float(cov[1, 1]))),
                len(u))


def error_upper(rule: Rule, similarity: float, z: float = Z_95) -> float:
    """Upper confidence bound (one-sided, level of `z`) on P(wrong | similarity) under `rule`:
    1 - σ(η - z·sd(η)) with η the fitted logit at `similarity` and sd from the covariance.

    Invariants: in (0, 1); never below the point estimate 1 - σ(η); grows with z."""
    u = (similarity - CENTRE) * SCALE
    x = np.array([u, 1.0])
    eta = float(x @ np.array(rule.coef))
    var = float(x @ np.array(rule.cov) @ x)
    return float(1.0 - _sigmoid(eta - z * math.sqrt(max(var, 0.0))))


def vetoed(own: Iterable[Observation], similarity: float) -> bool:
    """Whether the entry's own record rules it out: a query at least as close as this one was
    answered wrongly by it (the embedding puts a different question that near)."""
    return any(not o.correct and o.similarity >= similarity for o in own)


def budget_cutoff(bounds: Sequence[float], delta: float, lookups: int) -> float:
    """The largest π such that the bounds ≤ π sum to at most δ·lookups (never below δ).

    `bounds`: the error bounds of the recent lookups' candidates; `lookups`: how many lookups
    those were (candidates or not). Serving exactly the candidates whose bound is ≤ π then
    spends an expected δ wrong hits per lookup at most, on the safest candidates first.
    Invariants: result ≥ δ; sum(b for b in bounds if b <= result) ≤ δ·lookups whenever the
    result is above δ; monotone non-decreasing in δ."""
    budget = delta * lookups
    spent, cutoff = 0.0, delta
    for value, count in sorted(Counter(bounds).items()):  # equal bounds go in together, or not at all
        if spent + value * count > budget:
            break
        spent += value * count
        cutoff = max(cutoff, value)
    return cutoff


def within_budget(spent: float, bound: float, delta: float, lookups: int) -> bool:
    """Whether serving a candidate with error bound `bound` keeps the expected wrong hits of
    the hits served so far (`spent`, the sum of their bounds) within δ per lookup.

    Invariant: serving only when this holds keeps spent ≤ δ·lookups after every lookup, so the
    expected wrong-hit rate is ≤ δ at every moment, not only on average, whenever the bounds
    hold."""
    return spent + bound <= delta * lookups


def wilson_upper(errors: int, n: int, z: float = 1.959963984540054) -> float:
    """Upper end of the Wilson score interval for a proportion errors/n (two-sided 95% by default);
    1.0 for n = 0. Invariant: ≥ errors/n and ≤ 1."""
    if n <= 0:
        return 1.0
    p = errors / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return min(1.0, max(p, (centre + half) / (1 + z * z / n)))  # max: float rounding at p = 1


def normalise_answer(text: str) -> str:
    """Case-folded, whitespace-collapsed, stripped: what "the same answer" compares."""
    return re.sub(r"\s+", " ", text).strip().casefold()
