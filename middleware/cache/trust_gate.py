"""`semantic.max_error_rate`: serve a candidate, or explore it (kvgate.index.responses.trust holds the pure rule).

Per lookup of such a route, the nearest entry at cosine ≥ EXPLORE_FLOOR is judged by its
estimated P(wrong) at its similarity: the entry's own fit
when it has OWN_MIN observations (then its upper bound, charged as is), else the route's pooled
fit (shrunk towards the embedder's calibration curve when one is given: `prior`); an entry its
own record vetoes is never served. The candidate is served when its estimate is ≤ the route's
cutoff (kvgate.index.responses.trust.budget_cutoff over the last HISTORY lookups' candidates) and the ledger
affords it: the upper bound on the expected wrong hits of the hits served in the last HISTORY
lookups, this one included (kvgate.index.responses.trust.aggregate_upper), is within kvgate.index.responses.trust.allowance of
those lookups. Otherwise it is *explored*: the request is a miss (the client gets the backend's
fresh answer, no later than any miss), and once the answer is in, a single background worker
compares it with the entry's cached answer, off the response path, and records the verdict.

Verdict rule: deterministic requests (temperature 0, or a seed) agree when the normalised texts
are equal; others when the texts are equal or the cosine of their embeddings is ≥ ANSWER_AGREE.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from kvgate.index.responses.entries.base import CacheEntry
from kvgate.index.responses.observations.base import ObservationStore
from kvgate.index.responses.trust import (
    DIM,
    Observation,
    Rule,
    aggregate_upper,
    allowance,
    budget_cutoff,
    charges,
    error_upper,
    features,
    fit_rule,
    normalise_answer,
    vetoed,
    wrong_probabilities,
)
from kvgate.middleware.answers import answer_text

log = logging.getLogger("kvgate.trust")
EXPLORE_FLOOR = 0.6  # candidates farther than this are plain misses: no verdict worth a comparison
OWN_MIN = 8  # an entry's own fit is used once it has this many observations
HISTORY = 4096  # lookups the cutoff and the ledger look back on
RECUT_EVERY = 64  # lookups between two computations of a route's cutoff
REFIT_EVERY = 16  # new pooled observations before a route's pooled rule is refitted
ANSWER_AGREE = 0.9  # non-deterministic requests: answer embeddings at least this close agree
# A candidate more likely wrong than right is never served, whatever the budget: early in a
# window few candidates have come, so the budget looks ample and would go to poor ones, and
# they would hold it for the whole window while better candidates come later.
MAX_P_WRONG = 0.5


@dataclass(frozen=True)
class Exploration:
    """A candidate judged unsure: compared with the fresh answer once it is in."""

    route: str
    entry: CacheEntry
    similarity: float
    ttl: float | None


@dataclass(frozen=True)
class Judgement:
    serve: bool
    p_wrong: float  # estimated probability that serving this candidate is wrong (1.0: no candidate)
    explore: Exploration | None = None


@dataclass(frozen=True)
class _Candidate:
    """One lookup's candidate as the ledger keeps it: pooled-model features (re-estimated when
    the rule is refitted), or a fixed charge (own fit, veto, no candidate)."""

    lookup: int
    row: np.ndarray | None
    fixed: float


class _RouteState:
    """One route's pooled rule, its last HISTORY lookups' candidates and the hits it served
    among them (this process)."""

    def __init__(self, prior: Rule | None) -> None:
        self.rule: Rule = fit_rule([], prior=prior)
        self.fitted_at = -1
        self.lookups = 0
        self.candidates: deque[_Candidate] = deque(maxlen=HISTORY)
        self.served: deque[_Candidate] = deque()
        self.cutoff: float | None = None

    def forget_old(self) -> None:
        while self.served and self.served[0].lookup <= self.lookups - HISTORY:
            self.served.popleft()

    def window(self) -> int:
        return min(self.lookups, HISTORY)

    def charges(self, items: Sequence[_Candidate]) -> tuple[np.ndarray, np.ndarray]:
        """Estimates and gradients of `items` under the current rule (fixed charges: no gradient)."""
        rows = np.stack([c.row if c.row is not None else np.zeros(DIM) for c in items]) if items else np.zeros((0, DIM))
        p, grads = charges(self.rule, rows)
        fixed = np.array([c.row is None for c in items], dtype=bool)
        p[fixed] = [c.fixed for c in items if c.row is None]
        grads[fixed] = 0.0
        return p, grads

    def ledger(self, extra: _Candidate) -> float:
        """Upper prediction bound on the wrong answers among the hits served in the window plus
        `extra` (kvgate.index.responses.trust.aggregate_upper; fixed charges added as they are)."""
        items = [*self.served, extra]
        rows = [c.row for c in items if c.row is not None]
        pooled = aggregate_upper(self.rule, np.stack(rows)) if rows else 0.0
        return pooled + sum(c.fixed for c in items if c.row is None)


class TrustGate:
    """Judges candidates of `max_error_rate` routes and records verdicts; thread-safe."""

    def __init__(
        self,
        store: ObservationStore,
        embed: Callable[[list[str]], np.ndarray],
        on_verdict: Callable[[str, bool], None] = lambda _route, _ok: None,
        prior: Rule | None = None,
    ) -> None:
        self.store = store
        self.prior = prior
        self._embed = embed
        self._on_verdict = on_verdict
        self._routes: dict[str, _RouteState] = {}
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvgate-explore")
        self._pending: deque[Future[None]] = deque(maxlen=1024)

    def _state(self, route: str) -> _RouteState:
        with self._lock:
            state = self._routes.get(route)
            if state is None:
                state = self._routes[route] = _RouteState(self.prior)
            return state

    def judge(
        self, route: str, delta: float, entry: CacheEntry | None, similarity: float, ttl: float | None
    ) -> Judgement:
        """Serve or explore the nearest candidate (None: no candidate; counts as a lookup)."""
        state = self._state(route)
        if entry is None or similarity < EXPLORE_FLOOR:
            self._remember(state, None, 1.0, delta)
            return Judgement(False, 1.0)
        own = self._safe(lambda: self.store.of_entry(entry.id), [])
        rule = self._pooled(route, state)
        row: np.ndarray | None = None
        if vetoed(own, similarity):
            p_wrong = 1.0
        elif len(own) >= OWN_MIN:
            p_wrong = error_upper(fit_rule(own), similarity)
        else:
            row = features(similarity)
            p_wrong = float(wrong_probabilities(rule, row[None, :])[0])
        with self._lock:
            candidate, cutoff = self._remember_locked(state, row, p_wrong, delta)
            serve = p_wrong <= min(cutoff, MAX_P_WRONG) and state.ledger(candidate) <= allowance(state.window(), delta)
            if serve:
                state.served.append(candidate)
        if serve:
            return Judgement(True, p_wrong)
        return Judgement(False, p_wrong, Exploration(route, entry, similarity, ttl))

    def _remember(self, state: _RouteState, row: np.ndarray | None, p_wrong: float, delta: float) -> None:
        with self._lock:
            self._remember_locked(state, row, p_wrong, delta)

    def _remember_locked(
        self, state: _RouteState, row: np.ndarray | None, p_wrong: float, delta: float
    ) -> tuple[_Candidate, float]:
        state.lookups += 1
        state.forget_old()
        candidate = _Candidate(state.lookups, row, p_wrong if row is None else 0.0)
        state.candidates.append(candidate)
        if state.cutoff is None or state.lookups % RECUT_EVERY == 0:
            p, grads = state.charges(list(state.candidates))
            keep = p < 1.0
            state.cutoff = budget_cutoff(
                p[keep], grads[keep], np.array(state.rule.cov), allowance(state.window(), delta)
            )
        return candidate, state.cutoff

    def _pooled(self, route: str, state: _RouteState) -> Rule:
        count = self._safe(lambda: self.store.count(route), state.fitted_at)
        if count - state.fitted_at >= REFIT_EVERY or (state.fitted_at < 0 < count):
            rule = fit_rule(self._safe(lambda: self.store.pool(route), []), prior=self.prior)
            with self._lock:
                state.rule = rule
                state.fitted_at = count
                state.cutoff = None  # the candidates' estimates moved with the rule
        return state.rule

    def compare_later(self, exploration: Exploration, fresh: str, deterministic: bool) -> None:
        """Queue the comparison of the fresh answer with the entry's (the single worker)."""
        self._pending.append(self._worker.submit(self._compare, exploration, fresh, deterministic))

    def _compare(self, exploration: Exploration, fresh: str, deterministic: bool) -> None:
        cached = answer_text(exploration.entry.response) or ""
        agree = normalise_answer(cached) == normalise_answer(fresh)
        if not agree and not deterministic and cached and fresh:
            vecs = self._embed([cached, fresh])
            agree = float(np.dot(vecs[0], vecs[1])) >= ANSWER_AGREE
        self.observe(exploration.route, exploration.entry.id, exploration.similarity, agree, exploration.ttl)
        self._on_verdict(exploration.route, agree)

    def observe(self, route: str, entry_id: int, similarity: float, correct: bool, ttl: float | None = None) -> None:
        """Record one verdict (exploration or feedback); storage trouble drops it, logged."""
        self._safe(lambda: self.store.add(route, entry_id, Observation(similarity, correct), ttl), None)

    def drain(self) -> None:
        """Wait for the comparisons queued so far (benchmarks, tests)."""
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        self.store.close()

    def _safe(self, call: Callable[[], object], default: object) -> object:
        try:
            return call()
        except self.store.failures as exc:
            log.warning("observation store: %s", exc)
            return default
