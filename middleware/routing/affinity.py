"""affinity: sticky sessions by consistent hashing with bounded loads (CHWBL).

A session key (the request's `user`, else its first message) hashes onto a ring of virtual nodes;
the request goes to the first replica clockwise whose load stays within
ceil(load_factor · (total_in_flight + 1) / replicas). Same session → same replica while that
replica is not overloaded; adding or losing a replica moves only ~1/N of the sessions.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from typing import Sequence

from kvgate.middleware.routing.base import ReplicaState, RoutePlan
from kvgate.middleware.routing_config import AffinityConfig

VIRTUAL_NODES = 64


def _point(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


class Affinity:
    name = "affinity"

    def __init__(self, settings: AffinityConfig | None = None, **knobs: float) -> None:
        """`settings`: routing.policy of the route; else built from `knobs` (load_factor=...)."""
        self.settings = settings if settings is not None else AffinityConfig(**knobs)
        self.load_factor = self.settings.load_factor
        self._ring: tuple[list[int], list[str]] | None = None
        self._ring_names: tuple[str, ...] = ()

    def _ring_for(self, names: tuple[str, ...]) -> tuple[list[int], list[str]]:
        if self._ring is None or self._ring_names != names:
            nodes = sorted((_point(f"{n}#{v}"), n) for n in names for v in range(VIRTUAL_NODES))
            self._ring = ([p for p, _ in nodes], [n for _, n in nodes])
            self._ring_names = names
        return self._ring

    def choose(self, candidates: Sequence[ReplicaState], plan: RoutePlan) -> ReplicaState:
        by_name = {r.name: r for r in candidates}
        points, owners = self._ring_for(tuple(sorted(by_name)))
        total = sum(r.in_flight for r in candidates)
        bound = math.ceil(self.load_factor * (total + 1) / len(candidates))
        start = bisect.bisect(points, _point(plan.session or ""))
        seen: set[str] = set()
        for i in range(len(points)):
            name = owners[(start + i) % len(points)]
            if name in seen:
                continue
            seen.add(name)
            if by_name[name].in_flight + 1 <= bound:
                return by_name[name]
        return min(candidates, key=lambda r: r.in_flight)
