"""least_loaded: the replica with the fewest requests in flight (ties: fewest served so far)."""
from __future__ import annotations

from typing import Sequence

from middleware.routing.base import ReplicaState, RoutePlan


class LeastLoaded:
    name = "least_loaded"

    def choose(self, candidates: Sequence[ReplicaState], plan: RoutePlan) -> ReplicaState:
        return min(candidates, key=lambda r: (r.in_flight, r.requests))
