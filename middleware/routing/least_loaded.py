"""least_loaded: the replica with the fewest requests in flight (ties: fewest served so far)."""

from __future__ import annotations

from typing import Sequence

from kvgate.middleware.routing.base import ReplicaState, RoutePlan
from kvgate.middleware.routing_config import LeastLoadedConfig


class LeastLoaded:
    name = "least_loaded"

    def __init__(self, settings: LeastLoadedConfig | None = None) -> None:
        self.settings = settings or LeastLoadedConfig()

    def choose(self, candidates: Sequence[ReplicaState], plan: RoutePlan) -> ReplicaState:
        return min(candidates, key=lambda r: (r.in_flight, r.requests))
