"""LocalState: one proxy process routes alone; nothing is shared (the default)."""

from __future__ import annotations

from typing import Sequence

from kvgate.middleware.routing.state import ApplyRecord


class LocalState:
    """Counts in a dict; records go nowhere (this process's own index already has them).

    Not locked: the Router calls it under its own lock."""

    shared = False

    def __init__(self, replicas: Sequence[str]) -> None:
        self._load = {name: [0, 0] for name in replicas}

    def add_load(self, replica: str, in_flight: int, pending_tokens: int) -> None:
        counts = self._load[replica]
        counts[0] += in_flight
        counts[1] += pending_tokens

    def load(self, replica: str) -> tuple[int, int]:
        in_flight, pending = self._load[replica]
        return in_flight, pending

    def add_replica(self, replica: str) -> None:
        """A replica added while the proxy runs (Router.add_replica); counts start at zero. A
        removed replica's counts are never dropped: requests still in flight on it settle them."""
        self._load.setdefault(replica, [0, 0])

    def recorded(self, replica: str, hashes: Sequence[int]) -> None:
        pass

    def follow(self, apply: ApplyRecord) -> None:
        pass

    def close(self) -> None:
        pass
