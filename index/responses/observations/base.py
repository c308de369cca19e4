"""The ObservationStore protocol: where `semantic.max_error_rate` keeps what it has verified.

Per cache entry, the observations `(similarity, correct?)` of queries compared with it (an
exploration's verdict, or feedback); per route, a bounded pool of every observation of that route
(the fallback rule of entries that have few of their own). Like the EntryStore it is the shared
truth: every process that opens the same store sees the same observations, and they survive
restarts. Both implementations (disk.py: one cache dir; redis.py: the scale-out store, shared by
proxies on several machines) keep the same rules:
  - `add` is atomic per entry list (a diskcache transaction; MULTI/EXEC on Redis);
  - lists are bounded: an entry keeps its last `per_entry` observations, a route its last
    `per_route`;
  - `count(route)` only grows: a reader refits its cached rule when it moved;
  - storage trouble raises one of `failures`; callers treat it as "no observations".
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from kvgate.index.responses.trust import Observation


@runtime_checkable
class ObservationStore(Protocol):
    """Observations per entry and per route, shared by the processes on one cache."""

    failures: tuple[type[BaseException], ...]

    def add(self, route: str, entry_id: int, observation: Observation, ttl: float | None = None) -> None:
        """Append to the entry's list (expiring with the entry after `ttl` s) and the route's pool."""
        ...

    def of_entry(self, entry_id: int) -> list[Observation]:
        """The entry's observations, oldest first ([] when none or expired)."""
        ...

    def pool(self, route: str) -> list[Observation]:
        """The route's most recent observations (at most `per_route`), in no promised order."""
        ...

    def count(self, route: str) -> int:
        """Observations ever added to the route's pool (the pool keeps only the last ones)."""
        ...

    def close(self) -> None: ...
