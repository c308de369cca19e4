"""The semantic tier's decision for one request: embed the query, search its scope, and serve a
candidate or not (cosine floors and the verifier, or the trust gate on max_error_rate routes).

Invariant: a candidate is served only from the request's own scope (the index searches one scope)
and, on max_error_rate routes, only when the trust gate says its wrong-hit bound holds.
"""

from __future__ import annotations

import time

import numpy as np

from kvgate.index.responses.embedder import Embedder
from kvgate.index.responses.semantic import CacheEntry, SemanticIndex
from kvgate.index.responses.tighten import threshold_for
from kvgate.index.responses.verifier import Verifier
from kvgate.middleware.cache.parents import PARENT_SEARCH_K, PARENT_THRESHOLD, same_parents
from kvgate.middleware.cache.trust_gate import TrustGate
from kvgate.middleware.cache.verification import SemanticSettings, choose, to_verify
from kvgate.middleware.outcome import Hit, Lookup
from kvgate.middleware.request import RequestView
from kvgate.middleware.telemetry.metrics import Metrics


def count_lookup(metrics: Metrics, view: RequestView, tier: str, started: float, hit: bool) -> None:
    route = view.route.name
    metrics.lookups.labels(route, tier).inc()
    metrics.lookup_latency.labels(route, tier).observe(time.perf_counter() - started)
    if hit:
        metrics.hits.labels(route, tier).inc()


class SemanticLookup:
    """The semantic tier's read side; one per pipeline, shared across requests."""

    def __init__(
        self,
        index: SemanticIndex,
        embedder: Embedder | None,
        settings: dict[str, SemanticSettings],
        verifier: Verifier | None,
        trust: TrustGate | None,
        metrics: Metrics,
    ) -> None:
        self.index = index
        self.embedder = embedder
        self.settings = settings
        self.verifier = verifier
        self.trust = trust
        self.metrics = metrics

    def embed_many(self, texts: list[str]) -> np.ndarray:
        assert self.embedder is not None, "semantic tier used without an embedder"
        return self.embedder.embed(texts)

    def embed(self, text: str) -> np.ndarray:
        return self.embed_many([text])[0]

    def look_up(self, view: RequestView) -> Lookup:
        sem = view.route.semantic
        if view.control.no_cache or not sem.enabled or view.query_text is None:
            return Lookup()
        started = time.perf_counter()
        settings = self.settings[view.route.name]
        vector = self.embed(view.query_text)
        if view.parents is None:
            found = self.index.search(view.scope, vector, k=settings.candidates)
        else:  # context: semantic: the same follow-up text may close many conversations; keep those whose history matches
            found = same_parents(
                self.embed_many,
                view.parents,
                self.index.search(view.scope, vector, k=PARENT_SEARCH_K),
                settings.threshold or PARENT_THRESHOLD,
            )[: settings.candidates]
        if settings.max_error_rate is not None:
            return self._judged(view, settings.max_error_rate, found, vector, started)
        sims = [similarity for _, similarity in found]
        floors = [threshold_for(settings.threshold, entry.min_similarity) for entry, _ in found]
        served = choose(sims, floors, self._verify(view, found, sims, floors, settings), settings)
        hit = Hit(found[served][0], "semantic", found[served][1]) if served is not None else None
        count_lookup(self.metrics, view, "semantic", started, hit is not None)
        return Lookup(hit, vector)

    def _judged(
        self, view: RequestView, delta: float, found: list[tuple[CacheEntry, float]], vector: np.ndarray, started: float
    ) -> Lookup:
        """A max_error_rate route: the trust gate serves the nearest candidate or explores it."""
        assert self.trust is not None
        entry, similarity = found[0] if found else (None, 0.0)
        judged = self.trust.judge(view.route.name, delta, entry, similarity, view.control.ttl or view.route.ttl)
        route = view.route.name
        hit = Hit(entry, "semantic", similarity) if judged.serve and entry is not None else None
        if hit is not None:
            self.metrics.served_wrong_estimate.labels(route).inc(judged.p_wrong)
        if judged.explore is not None:
            self.metrics.explorations.labels(route).inc()
        count_lookup(self.metrics, view, "semantic", started, hit is not None)
        return Lookup(hit, vector, judged.explore)

    def _verify(
        self,
        view: RequestView,
        found: list[tuple[CacheEntry, float]],
        sims: list[float],
        floors: list[float],
        settings: SemanticSettings,
    ) -> dict[int, float]:
        """Verifier scores of the candidates that passed their cosine floor; counts a rejection
        when there were some and none reaches the verifier threshold."""
        positions = to_verify(sims, floors, settings)
        if not positions or self.verifier is None:
            return {}
        probs = self.verifier.score([(found[i][0].text, view.query_text or "") for i in positions])
        scores = {i: float(p) for i, p in zip(positions, probs)}
        if max(scores.values()) < (settings.verifier_threshold or 0.0):
            self.metrics.verifier_rejections.labels(view.route.name).inc()
        return scores

    def explored(self, view: RequestView, exploration: object, answer: str | None) -> None:
        """After an explored miss: the comparison with the cached answer, queued off the response path."""
        if exploration is None or answer is None or self.trust is None:
            return
        forwarded = {**view.params, **view.forwarded}
        deterministic = forwarded.get("temperature") == 0 or forwarded.get("seed") is not None
        self.trust.compare_later(exploration, answer, deterministic)  # type: ignore[arg-type]
