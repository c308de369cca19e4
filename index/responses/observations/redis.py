"""RedisObservationStore: observations on the shared Redis of `store: redis`, so every proxy on it
(on any machine) judges candidates from the same verified record.

Layout (P = the store's key_prefix, e.g. "kvgate:"):
  P o:e:<id>      list of "similarity:0|1", the entry's last `per_entry` observations; it expires
                  with the entry (the TTL of the entry's route) when one is given
  P o:n:<route>   the route's add counter (only grows)
  P o:p:<route>   list of "similarity:0|1", the route's last `per_route` observations (newest first)

One `add` is one MULTI/EXEC transaction (RPUSH+LTRIM of the entry, INCR, LPUSH+LTRIM of the pool):
a reader never sees the entry's list grow without the route's counter moving with it, and two
proxies appending to one entry both land. Entry ids come from the entry store's shared counter
(kvgate.index.responses.entries.redis), so they name one entry across proxies. Calls go through the store's
RedisLink (pool, timeouts, circuit): Redis trouble raises a RedisError, which the caller
(kvgate.middleware.cache.trust_gate) treats as "no observations" — a miss, never an error.
"""

from __future__ import annotations

from typing import Iterable

import redis

from kvgate.index.responses.observations.disk import PER_ENTRY, PER_ROUTE
from kvgate.index.responses.trust import Observation
from kvgate.index.storage.redis_link import RedisLink


def _pack(observation: Observation) -> bytes:
    return f"{float(observation.similarity)!r}:{int(observation.correct)}".encode()


def _unpack(rows: Iterable[bytes]) -> list[Observation]:
    """Rows in the layout above; a malformed row (a foreign writer) is skipped, never raised."""
    out = []
    for raw in rows:
        similarity, _, correct = raw.partition(b":")
        try:
            out.append(Observation(float(similarity), correct == b"1"))
        except ValueError:
            continue
    return out


class RedisObservationStore:
    """ObservationStore on Redis; shares the link (pool, circuit) of the response cache's store."""

    def __init__(
        self, link: RedisLink, key_prefix: str = "kvgate:", per_entry: int = PER_ENTRY, per_route: int = PER_ROUTE
    ) -> None:
        self.link = link
        self.per_entry = per_entry
        self.per_route = per_route
        self._e, self._n, self._p = f"{key_prefix}o:e:", f"{key_prefix}o:n:", f"{key_prefix}o:p:"
        self.failures: tuple[type[BaseException], ...] = (redis.exceptions.RedisError,)

    def add(self, route: str, entry_id: int, observation: Observation, ttl: float | None = None) -> None:
        row, entry = _pack(observation), self._e + str(entry_id)

        def write(r: redis.Redis) -> None:
            pipe = r.pipeline(transaction=True)
            pipe.rpush(entry, row)
            pipe.ltrim(entry, -self.per_entry, -1)
            if ttl is not None:
                pipe.pexpire(entry, max(1, int(ttl * 1000)))
            pipe.incr(self._n + route)
            pipe.lpush(self._p + route, row)
            pipe.ltrim(self._p + route, 0, self.per_route - 1)
            pipe.execute()

        self.link.run("observe", write)

    def of_entry(self, entry_id: int) -> list[Observation]:
        return _unpack(self.link.run("lookup", lambda r: r.lrange(self._e + str(entry_id), 0, -1)))

    def pool(self, route: str) -> list[Observation]:
        return _unpack(self.link.run("lookup", lambda r: r.lrange(self._p + route, 0, -1)))

    def count(self, route: str) -> int:
        return int(self.link.run("lookup", lambda r: r.get(self._n + route)) or 0)

    def close(self) -> None:
        """The link is the entry store's: it closes it."""
