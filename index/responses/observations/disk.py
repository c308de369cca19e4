"""DiskObservationStore: observations in one diskcache directory, shared by every process that
opens it (SQLite; JSON values, no pickle).

Layout: "e:<id>" the entry's observations as [[similarity, 0|1], ...]; "n:<route>" the route's
add counter; "p:<route>:<slot>" the route's pool as a ring of `per_route` slots (slot = counter
modulo per_route), each one [similarity, 0|1].
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import diskcache

from kvgate.index.responses.trust import Observation

PER_ENTRY = 64
PER_ROUTE = 4096


class DiskObservationStore:
    """ObservationStore on a diskcache directory; one handle per process, any number of processes."""

    def __init__(self, directory: str | Path, per_entry: int = PER_ENTRY, per_route: int = PER_ROUTE) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.cache = diskcache.Cache(str(directory), eviction_policy="none", size_limit=2**40)
        self.per_entry = per_entry
        self.per_route = per_route
        self.failures: tuple[type[BaseException], ...] = (sqlite3.Error, OSError, diskcache.Timeout, ValueError)

    def add(self, route: str, entry_id: int, observation: Observation, ttl: float | None = None) -> None:
        row = [float(observation.similarity), int(observation.correct)]
        with self.cache.transact():  # another process may append to the same entry meanwhile
            rows = json.loads(self.cache.get(f"e:{entry_id}", "[]"))
            rows = (rows + [row])[-self.per_entry :]
            self.cache.set(f"e:{entry_id}", json.dumps(rows), expire=ttl)
        slot = (int(self.cache.incr(f"n:{route}")) - 1) % self.per_route
        self.cache.set(f"p:{route}:{slot}", json.dumps(row))

    def of_entry(self, entry_id: int) -> list[Observation]:
        return [Observation(float(s), bool(c)) for s, c in json.loads(self.cache.get(f"e:{entry_id}", "[]"))]

    def pool(self, route: str) -> list[Observation]:
        out = []
        for slot in range(min(self.count(route), self.per_route)):
            raw = self.cache.get(f"p:{route}:{slot}")
            if raw is not None:
                s, c = json.loads(raw)
                out.append(Observation(float(s), bool(c)))
        return out

    def count(self, route: str) -> int:
        return int(self.cache.get(f"n:{route}", 0) or 0)

    def close(self) -> None:
        self.cache.close()
