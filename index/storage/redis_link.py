"""RedisLink: one pooled redis-py client to a shared Redis, with a circuit that backs off.

Every store on Redis (kvgate.index.responses.entries.redis, the request-id log) sends its commands through
`RedisLink.run`. While Redis answers, that is one call. When a call fails (refused, timed out,
out of memory), the link opens: for the next `backoff` seconds every call raises `StoreDown`
at once, without a round trip, so a dead Redis costs a request nothing but a miss; then one call
is let through to try again, and the backoff doubles (up to `backoff_max_s`) while it keeps
failing. The first success closes the link and resets the backoff. Failures are counted per
operation (`errors`, exported as kvgate_store_errors_total{op}); `up` is kvgate_store_up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis

T = TypeVar("T")


class StoreDown(redis.exceptions.ConnectionError):
    """Raised without trying while the link backs off after a failure."""


@dataclass(frozen=True)
class LinkSettings:
    """How to reach Redis (kvgate.middleware.store_config.StoreConfig holds the user's values)."""

    url: str
    password: str | None = None
    connect_timeout_s: float = 0.5
    op_timeout_s: float = 0.5
    pool_size: int = 32
    backoff_min_s: float = 0.1
    backoff_max_s: float = 5.0


def redacted(url: str) -> str:
    """`url` without user name or password: safe for logs and error messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class RedisLink:
    """A redis-py client (blocking pool of `pool_size` connections) and its circuit; thread-safe."""

    def __init__(self, settings: LinkSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        """`clock` times the backoff (seconds; tests pass their own)."""
        self.settings = settings
        self._clock = clock
        self.where = redacted(settings.url)
        pool = redis.BlockingConnectionPool.from_url(
            settings.url,
            password=settings.password,
            max_connections=settings.pool_size,
            timeout=settings.op_timeout_s,
            socket_connect_timeout=settings.connect_timeout_s,
            socket_timeout=settings.op_timeout_s,
        )
        self.client = redis.Redis(connection_pool=pool)
        self._lock = threading.Lock()
        self._retry_at = 0.0  # clock time before which calls are refused (0: closed)
        self._backoff = 0.0
        self.errors: dict[str, int] = {}
        self.up = True

    def run(self, op: str, call: Callable[[redis.Redis], T]) -> T:
        """`call(client)`; raises StoreDown while backing off, or the redis error it met."""
        now = self._clock()
        if self._retry_at and now < self._retry_at:
            self._count(op)
            raise StoreDown(f"redis at {self.where} is down; retrying in {self._retry_at - now:.2f}s")
        try:
            out = call(self.client)
        except redis.exceptions.RedisError:
            self._failed(op)
            raise
        if self._retry_at:
            with self._lock:
                self._retry_at, self._backoff, self.up = 0.0, 0.0, True
        return out

    def ping(self) -> None:
        """Raise the redis error that keeps Redis out of reach (start-up check), else nothing."""
        self.run("ping", lambda r: r.ping())

    def _failed(self, op: str) -> None:
        with self._lock:
            self._backoff = min(self.settings.backoff_max_s, max(self.settings.backoff_min_s, self._backoff * 2))
            self._retry_at = self._clock() + self._backoff
            self.up = False
        self._count(op)

    def _count(self, op: str) -> None:
        with self._lock:
            self.errors[op] = self.errors.get(op, 0) + 1

    def close(self) -> None:
        self.client.close()
        self.client.connection_pool.disconnect()
