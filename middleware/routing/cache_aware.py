"""cache_aware: minimise the request's expected time to first token.

For each candidate replica r the expected TTFT, in prefill-token units, is

    cost(r) = queued(r) + (prompt_tokens − matched_tokens(r)) + decode_weight · in_flight(r)

- queued(r): uncached prompt tokens of requests already sent to r that have not produced their
  first token — the prefill work ahead of us (engines prefill roughly one batch at a time);
- prompt_tokens − matched_tokens(r): our own prefill on r, after the longest cached prefix;
- decode_weight · in_flight(r): running decodes slow a batched engine down a little; the weight is
  the prefill-token equivalent of one concurrent decode (default 64).

Choosing argmin cost(r) is "expected prefill saved − expected queueing cost": a replica holding
a long prefix wins until the work queued on it outweighs what it saves, so a popular prefix
spreads to a second replica instead of piling up — the balance sglang's cache_aware policy strikes
with fixed thresholds (balance_abs/rel, cache_threshold) falls out of one formula here.
Ties go to the replica with fewer requests in flight, then round robin.
"""
from __future__ import annotations

import itertools
import threading
from typing import Sequence

from middleware.routing.base import ReplicaState, RoutePlan

DEFAULT_DECODE_WEIGHT = 64.0


def expected_cost(replica: ReplicaState, plan: RoutePlan, decode_weight: float = DEFAULT_DECODE_WEIGHT) -> float:
    """Expected prefill-token work before this request's first token on `replica` (pure)."""
    own = plan.prompt_tokens - plan.matched_tokens(replica.name)
    return replica.pending_prefill_tokens + own + decode_weight * replica.in_flight


class CacheAware:
    name = "cache_aware"

    def __init__(self, decode_weight: float = DEFAULT_DECODE_WEIGHT) -> None:
        self.decode_weight = decode_weight
        self._tie = itertools.count()
        self._lock = threading.Lock()

    def choose(self, candidates: Sequence[ReplicaState], plan: RoutePlan) -> ReplicaState:
        with self._lock:
            turn = next(self._tie)
        n = len(candidates)
        return min(
            (candidates[(turn + i) % n] for i in range(n)),
            key=lambda r: (expected_cost(r, plan, self.decode_weight), r.in_flight),
        )
