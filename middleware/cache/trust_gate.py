"""`semantic.max_error_rate`: serve a candidate, or explore it (index.trust holds the pure rule).

Per lookup of such a route, the nearest entry at cosine ≥ EXPLORE_FLOOR is judged: its error
bound comes from its own observations' fit when it has OWN_MIN of them, else from the route's
pooled fit; an entry its own record vetoes is never served. The candidate is served when its
bound is ≤ the route's budget cutoff (index.trust.budget_cutoff over the last HISTORY lookups)
and the ledger affords it (index.trust.within_budget: the bounds of the hits served so far plus
this one stay ≤ δ per lookup);
otherwise it is *explored*: the request is a miss (the client gets the backend's fresh answer,
no later than any miss), and once the answer is in, a single background worker compares it with
the entry's cached answer, off the response path, and records the verdict as an observation.

Verdict rule: deterministic requests (temperature 0, or a seed) agree when the normalised texts
are equal; others when the texts are equal or the cosine of their embeddings is ≥ ANSWER_AGREE.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from index.entries.base import CacheEntry
from index.observations.base import ObservationStore
from index.trust import (
    Observation, Rule, budget_cutoff, error_upper, fit_rule, normalise_answer, vetoed, within_budget,
)
from middleware.answers import answer_text

log = logging.getLogger("kvgate.trust")
EXPLORE_FLOOR = 0.6  # candidates farther than this are plain misses: no verdict worth a comparison
OWN_MIN = 8  # an entry's own fit is used once it has this many observations
HISTORY = 4096  # lookups the budget cutoff looks back on
REFIT_EVERY = 16  # new pooled observations before a route's pooled rule is refitted
ANSWER_AGREE = 0.9  # non-deterministic requests: answer embeddings at least this close agree


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
    bound: float  # upper bound on P(wrong) of serving this candidate
    explore: Exploration | None = None


class _RouteState:
    """One route's cached pooled rule and its recent lookups' bounds (this process)."""

    def __init__(self) -> None:
        self.rule: Rule = fit_rule([])
        self.fitted_at = -1
        self.bounds: deque[float] = deque(maxlen=HISTORY)  # candidates' bounds (1.0: none)
        self.cutoff: float | None = None
        self.lookups = 0  # lookups judged by this process, and the bounds of the hits it served:
        self.spent = 0.0  # the ledger that keeps served bounds ≤ δ per lookup at every moment


class TrustGate:
    """Judges candidates of `max_error_rate` routes and records verdicts; thread-safe."""

    def __init__(self, store: ObservationStore, embed: Callable[[list[str]], np.ndarray],
                 on_verdict: Callable[[str, bool], None] = lambda _route, _ok: None) -> None:
        self.store = store
        self._embed = embed
        self._on_verdict = on_verdict
        self._routes: dict[str, _RouteState] = {}
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvgate-explore")
        self._pending: deque[Future[None]] = deque(maxlen=1024)

    def _state(self, route: str) -> _RouteState:
        with self._lock:
            return self._routes.setdefault(route, _RouteState())

    def judge(self, route: str, delta: float, entry: CacheEntry | None, similarity: float,
              ttl: float | None) -> Judgement:
        """Serve or explore the nearest candidate (None: no candidate; counts as a lookup)."""
        state = self._state(route)
        if entry is None or similarity < EXPLORE_FLOOR:
            self._remember(state, 1.0, delta)
            return Judgement(False, 1.0)
        own = self._safe(lambda: self.store.of_entry(entry.id), [])
        if vetoed(own, similarity):
            bound = 1.0
        elif len(own) >= OWN_MIN:
            bound = error_upper(fit_rule(own), similarity)
        else:
            bound = error_upper(self._pooled(route, state), similarity)
        cutoff = self._remember(state, bound, delta)
        with self._lock:
            serve = bound <= cutoff and within_budget(state.spent, bound, delta, state.lookups)
            if serve:
                state.spent += bound
        if serve:
            return Judgement(True, bound)
        return Judgement(False, bound, Exploration(route, entry, similarity, ttl))

    def _remember(self, state: _RouteState, bound: float, delta: float) -> float:
        with self._lock:
            state.lookups += 1
            state.bounds.append(bound)
            if state.cutoff is None or len(state.bounds) % 64 == 0:
                state.cutoff = budget_cutoff([b for b in state.bounds if b < 1.0], delta, len(state.bounds))
            return state.cutoff

    def _pooled(self, route: str, state: _RouteState) -> Rule:
        count = self._safe(lambda: self.store.count(route), state.fitted_at)
        if count - state.fitted_at >= REFIT_EVERY or (state.fitted_at < 0 < count):
            state.rule = fit_rule(self._safe(lambda: self.store.pool(route), []))
            state.fitted_at = count
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
