"""round_robin: each request to the next replica in turn, ignoring caches and load."""

from __future__ import annotations

from typing import Sequence

from kvgate.middleware.routing.base import ReplicaState, Rotation, RoutePlan
from kvgate.middleware.routing_config import RoundRobinConfig


class RoundRobin:
    name = "round_robin"

    def __init__(self, settings: RoundRobinConfig | None = None) -> None:
        self.settings = settings or RoundRobinConfig()
        self._turns = Rotation()

    def choose(self, candidates: Sequence[ReplicaState], plan: RoutePlan) -> ReplicaState:
        return candidates[self._turns.turn() % len(candidates)]
