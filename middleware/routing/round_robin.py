"""round_robin: each request to the next replica in turn, ignoring caches and load."""

from __future__ import annotations

import itertools
import threading
from typing import Sequence

from kvgate.middleware.routing.base import ReplicaState, RoutePlan
from kvgate.middleware.routing_config import RoundRobinConfig


class RoundRobin:
    name = "round_robin"

    def __init__(self, settings: RoundRobinConfig | None = None) -> None:
        self.settings = settings or RoundRobinConfig()
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def choose(self, candidates: Sequence[ReplicaState], plan: RoutePlan) -> ReplicaState:
        with self._lock:
            n = next(self._counter)
        return candidates[n % len(candidates)]
