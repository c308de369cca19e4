"""The decision rule of `semantic.max_error_rate` (verified semantic caching, after vCache): pure
functions, no I/O.

A semantic candidate at cosine similarity `s` is judged by the model P(correct | s) = σ(w·x),
x = (u, 1), u = (s - CENTRE)·SCALE (vCache's logistic curve), fitted by penalised maximum
likelihood on verified observations (explorations: the backend's fresh answer compared with the
cached one; and feedback). Its covariance gives confidence bounds by the delta method.

The budget is kept on the *aggregate*, not per candidate: the route serves a candidate when
  * its estimated P(wrong) is at most the route's cutoff π (`budget_cutoff`: water-filling over
    the recent lookups' candidates, so the budget buys the safest hits first), and
  * the ledger still affords it (`aggregate_upper` ≤ `allowance`): an upper prediction bound on
    the wrong hits among the hits served in the last lookups, this one included (their expected
    count plus z standard deviations of chance and of the fit's own uncertainty), stays within
    the count of wrong hits whose rate's 95% Wilson upper bound is δ over those lookups.
Summing per-candidate upper bounds instead would charge each hit its own worst case: hundreds of
95% bounds added up are far above a 95% bound on the total, and the budget then buys fewer hits.

A prior can stand in for the first observations: the calibration curve `kvgate tune --embedder`
fits on its calibration pairs (P(duplicate | s)). `prior_rule` turns it into a Rule whose
information is capped at PRIOR_WEIGHT observations, and `fit_rule` shrinks towards it instead of
towards a flat curve.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

Z_95 = 1.6448536269514722  # one-sided 95% normal quantile
Z_WILSON = 1.959963984540054  # the two-sided 95% Wilson interval the wrong-hit rate is reported with
RIDGE = 0.5  # penalty on every coefficient of the centred, scaled fit: keeps separable data finite
CENTRE, SCALE = 0.85, 10.0  # u = (s - CENTRE) * SCALE: cosine similarities live in a narrow band
PRIOR_WEIGHT = 32.0  # a calibration prior counts as at most this many observations
DIM = 2  # (u, 1)


@dataclass(frozen=True)
class Observation:
    """One verified outcome: a query at `similarity` to an entry got a correct (or wrong) answer."""

    similarity: float
    correct: bool


@dataclass(frozen=True)
class Rule:
    """A fitted logistic P(correct | x) = σ(coef·x), x = features(s), with the inverse
    penalised Fisher information `cov` (DIM x DIM) for its confidence bounds; n observations."""

    coef: tuple[float, ...]
    cov: tuple[tuple[float, ...], ...]
    n: int

    @property
    def threshold(self) -> float:
        """The midpoint t (P(correct | t) = 0.5) in similarity units; inf when the fit is flat."""
        a, b = self.coef[0], self.coef[-1]
        return CENTRE - b / (a * SCALE) if a > 1e-9 else math.inf


def features(similarity: float) -> np.ndarray:
    """The model's input row (u, 1). Invariant: finite for finite input."""
    return np.array([(similarity - CENTRE) * SCALE, 1.0])


def _rows(observations: Sequence[Observation]) -> np.ndarray:
    if not observations:
        return np.zeros((0, DIM))
    return np.stack([features(o.similarity) for o in observations])


def _sigmoid(x: np.ndarray | float) -> np.ndarray | float:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -50.0, 50.0)))


def _as_rule(coef: np.ndarray, cov: np.ndarray, n: int) -> Rule:
    return Rule(tuple(float(c) for c in coef), tuple(tuple(float(v) for v in row) for row in cov), n)


def prior_rule(calibration: dict | None, weight: float = PRIOR_WEIGHT) -> Rule | None:
    """A calibration record ({coef, cov, n}, as `kvgate tune --embedder` writes it) as a prior
    holding at most `weight` observations' information (its covariance widened by n / weight);
    None for a missing or malformed record.

    Invariant: the result's covariance is positive definite and at least as wide as the record's."""
    try:
        coef = np.array([float(c) for c in calibration["coef"]])  # type: ignore[index]
        cov = np.array(calibration["cov"], dtype=np.float64)  # type: ignore[index]
        n = int(calibration["n"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return None
    if coef.shape != (DIM,) or cov.shape != (DIM, DIM) or not np.all(np.isfinite(cov)) or not np.all(np.isfinite(coef)):
        return None
    cov = (cov + cov.T) / 2 * max(1.0, n / weight)
    if np.linalg.eigvalsh(cov).min() <= 0:
        return None
    return _as_rule(coef, cov, 0)


def fit_rule(observations: Sequence[Observation], iterations: int = 25, prior: Rule | None = None) -> Rule:
    """Penalised logistic fit by Newton's method: ridge RIDGE on every coefficient, or, with a
    `prior`, a Gaussian penalty centred on its coefficients with its inverse covariance.

    Invariant: always returns finite coefficients and a positive-definite covariance, for any
    input (none, one class only, separable, contradictory); with no observations the fit is the
    prior (coef 0, cov I/RIDGE; or the given prior itself)."""
    x = _rows(observations)
    y = np.array([1.0 if o.correct else 0.0 for o in observations], dtype=np.float64)
    centre = np.array(prior.coef) if prior is not None else np.zeros(DIM)
    penalty = np.linalg.inv(np.array(prior.cov)) if prior is not None else RIDGE * np.eye(DIM)
    w = centre.copy()

    def objective(v: np.ndarray) -> float:  # penalised log-likelihood, maximised
        eta = x @ v
        return float(np.sum(y * eta - np.logaddexp(0.0, eta)) - 0.5 * (v - centre) @ penalty @ (v - centre))

    for _ in range(iterations):
        p = _sigmoid(x @ w)
        grad = x.T @ (y - p) - penalty @ (w - centre)
        hess = (x * (p * (1 - p))[:, None]).T @ x + penalty
        step = np.linalg.solve(hess, grad)
        current = objective(w)
        for _halving in range(30):  # a weak penalty on separable data: a full Newton step can overshoot
            if objective(w + step) >= current - 1e-12:
                break
            step = step / 2
        w = w + step
        if float(np.abs(step).max(initial=0.0)) < 1e-8:
            break
    p = _sigmoid(x @ w)
    info = (x * (p * (1 - p))[:, None]).T @ x + penalty
    return _as_rule(w, np.linalg.inv(info), len(x))


def error_upper(rule: Rule, similarity: float, z: float = Z_95) -> float:
    """Upper confidence bound (one-sided, level of `z`) on P(wrong | similarity) under `rule`:
    1 - σ(η - z·sd(η)) with η the fitted logit at `similarity` and sd from the covariance.

    Invariants: in (0, 1); never below the point estimate 1 - σ(η); grows with z."""
    x = features(similarity)
    eta = float(x @ np.array(rule.coef))
    var = float(x @ np.array(rule.cov) @ x)
    return float(1.0 - _sigmoid(eta - z * math.sqrt(max(var, 0.0))))


def wrong_probabilities(rule: Rule, rows: np.ndarray) -> np.ndarray:
    """Point estimates of P(wrong) for feature rows (n x DIM). Invariant: each in (0, 1)."""
    if len(rows) == 0:
        return np.zeros(0)
    return 1.0 - _sigmoid(rows @ np.array(rule.coef))


def aggregate_upper(rule: Rule, rows: np.ndarray, z: float = Z_95) -> float:
    """Upper prediction bound on the number of wrong answers among candidates with feature rows
    `rows`: Σ p + z·sqrt(Σ p(1-p) + gᵀ·cov·g), p = P(wrong) of each, g = Σ p(1-p)·x. The first
    variance is chance (each answer right or wrong on its own), the second the fit's uncertainty
    by the delta method (one error of the curve shifts every estimate together).

    Invariants: ≥ Σ p (the expected count); 0 for no rows; grows with z."""
    if len(rows) == 0:
        return 0.0
    p, grads = charges(rule, rows)
    return float(_upper(p, grads, np.array(rule.cov), z)[-1])


def _upper(p: np.ndarray, grads: np.ndarray, cov: np.ndarray, z: float) -> np.ndarray:
    """The bound of `aggregate_upper` for every prefix of (p, grads), in their order."""
    g = np.cumsum(grads, axis=0)
    var = np.cumsum(p * (1 - p)) + np.einsum("ij,jk,ik->i", g, cov, g)
    return np.cumsum(p) + z * np.sqrt(np.maximum(var, 0.0))


def allowance(lookups: int, delta: float, z: float = Z_WILSON) -> float:
    """How many wrong hits `lookups` lookups may expect so that the wrong-hit rate's 95% Wilson
    upper bound is still about δ: δ·n − z·sqrt(n·δ·(1 − δ)), never below 0.

    Invariants: ≤ δ·lookups; 0 while n is too small to tell a rate of δ from 0 (n·δ/(1−δ) ≤ z²);
    non-decreasing in δ and in lookups (for δ ≤ 1/2); wilson_upper(allowance/n, n) ≤ δ + o(1/n)."""
    n = max(lookups, 0)
    return max(0.0, delta * n - z * math.sqrt(n * delta * (1.0 - delta)))


def vetoed(own: Iterable[Observation], similarity: float) -> bool:
    """Whether the entry's own record rules it out: a query at least as close as this one was
    answered wrongly by it (the embedding puts a different question that near)."""
    return any(not o.correct and o.similarity >= similarity for o in own)


def charges(rule: Rule, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate row: the estimated P(wrong) and its gradient with respect to the rule's
    coefficients (p·(1 - p)·x, up to sign), what `aggregate_upper` sums."""
    p = wrong_probabilities(rule, rows)
    return p, (p * (1 - p))[:, None] * rows if len(rows) else np.zeros((0, DIM))


def budget_cutoff(
    estimates: np.ndarray, gradients: np.ndarray, cov: np.ndarray, budget: float, z: float = Z_95
) -> float:
    """The largest π such that the candidates with estimate ≤ π, served together, keep the bound
    of `aggregate_upper` on their wrong answers within `budget`; 0 when not even the safest fits.

    `estimates` (n), `gradients` (n x DIM; zero rows for charges the rule does not move): the
    recent lookups' candidates; `budget`: the wrong hits those lookups may have (`allowance`).
    Serving exactly the candidates whose estimate is ≤ π spends the budget on the safest first,
    under the same bound as the ledger's, so the ledger refuses only what chance brings beyond it.
    Invariants: monotone non-decreasing in budget; equal estimates go in together or not at all;
    the result is one of the estimates, or 0."""
    if len(estimates) == 0:
        return 0.0
    order = np.argsort(estimates, kind="mergesort")
    p = np.asarray(estimates, dtype=np.float64)[order]
    upper = _upper(p, np.asarray(gradients, dtype=np.float64)[order], np.asarray(cov, dtype=np.float64), z)
    last_of_tie = np.append(p[1:] != p[:-1], True)
    fits = np.maximum.accumulate(upper) <= budget  # a prefix fits only if every shorter one did
    ok = np.nonzero(fits & last_of_tie)[0]
    return float(p[ok[-1]]) if len(ok) else 0.0


def wilson_upper(errors: float, n: int, z: float = Z_WILSON) -> float:
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
