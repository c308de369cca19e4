"""Replica health: which replicas may take a request, circuits opened by failures, and the probe
that re-admits them.

Rule: a failed replica gets no traffic for `routing.down_for_s` (its circuit is open), then one
request may try it (half-open); a 200 from its `/models` closes the circuit. When every untried
replica is down, all of them are candidates: trying a maybe-dead replica beats failing for certain.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Sequence

import httpx

from kvgate.middleware.routing.base import ReplicaState

log = logging.getLogger("kvgate.router")


class ReplicaHealth:
    def __init__(self, down_for_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.down_for_s = down_for_s
        self._clock = clock
        self._lock = threading.Lock()

    def candidates(self, replicas: Sequence[ReplicaState], exclude: set[str] = frozenset()) -> list[ReplicaState]:
        """Healthy replicas, plus down ones whose cool-down passed (half-open); every untried one
        when all are down."""
        now = self._clock()
        untried = [r for r in replicas if r.name not in exclude]
        up = [r for r in untried if r.healthy or now >= r.down_until]
        return up or untried

    def mark_down(self, replica: ReplicaState, reason: str) -> None:
        with self._lock:
            replica.healthy = False
            replica.failures += 1
            replica.marked_down += 1
            replica.down_until = self._clock() + self.down_for_s
        log.warning("replica %s marked down for %.1fs: %s", replica.name, self.down_for_s, reason)

    def mark_up(self, replica: ReplicaState) -> None:
        with self._lock:
            was_down = not replica.healthy
            replica.healthy, replica.failures = True, 0
        if was_down:
            log.info("replica %s is back", replica.name)

    async def probe(
        self, client: httpx.AsyncClient, replicas: Sequence[ReplicaState], gone: Callable[[str], None]
    ) -> None:
        """One round: GET {api_base}/models on every down replica; 200 re-admits it; a replica
        refusing connections has no engine behind it (`gone(name)`)."""
        for replica in [r for r in replicas if not r.healthy]:
            try:
                resp = await client.get(f"{replica.api_base.rstrip('/')}/models", timeout=2.0)
                if resp.status_code == 200:
                    self.mark_up(replica)
            except httpx.ConnectError:
                gone(replica.name)
            except httpx.HTTPError:
                pass
