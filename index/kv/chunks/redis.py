"""RedisTier: encoded KV chunks in a Redis server that replicas on several machines share.

The remote tier of a ChunkStore (after RAM and disk): a replica that prefilled a conversation
writes its chunks here, and another replica with its own RAM and disk tiers loads them instead of
prefilling again. Values are the codec's checksummed chunks, byte for byte as on disk, under
`<prefix>:<store key>`, the store key being "kv:<model>:<dtype>:<chunk hash>", so replicas of
different models or dtypes never share a value (and a value filed under the wrong key fails the
codec's key check).

Round trips. A prompt's chunks go in one pipeline each way: `contains_many` (EXISTS) for the
prefix walk, `get_many` (GET, or GETEX when a TTL is set so a hit refreshes it) for the load,
`put_many` (SET NX [EX ttl]) for the write. A pipeline answers every key asked; `get_many` hands
back the leading run of found values, cut at the first missing one (values after a gap are
transferred only when a key vanished between the EXISTS walk and the read).

Budget: Redis's own `maxmemory` with an LRU policy (`allkeys-lru` on a Redis kept for KV), not a
byte counter of ours. A counter would drift as soon as Redis expires or evicts a key (neither
tells the writer), and LRU order across replicas needs the server's access clock anyway. The
tier reports `maxmemory` as its budget and Redis's `used_memory` / `evicted_keys` (the whole
instance) as bytes and evictions, and warns once when the server has no limit or refuses to
evict (`noeviction`: writes then fail with OOM and are skipped, counted).

Faults. A connection error or timeout marks Redis down: every operation then answers at once
as a miss (get, contains) or a skipped write (put), counted under "skipped", until the backoff
(doubling from `backoff_s` up to `max_backoff_s`) lets one operation try again; its success
marks Redis up. Errors are counted by operation and logged once per streak. Nothing raises to
the caller; a damaged value is the codec's business (ChunkStore deletes it, here too).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterator, Sequence, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from kvgate.index.storage.softfail import SoftFailures

log = logging.getLogger("kvgate.chunks.redis")

T = TypeVar("T")
MAX_VALUE_BYTES = 512 << 20  # Redis's default proto-max-bulk-len: a bigger SET is refused by the server
OPS = ("get", "put", "contains", "delete", "keys", "clear", "stats")
_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)  # the server is unreachable, not unhappy


class Backoff:
    """Up/down state of one server. Invariant: while down, `allow()` is true only once the delay
    since the last failure has passed; each failure in a row doubles the delay up to `cap`."""

    def __init__(self, first: float, cap: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.first, self.cap, self._clock = first, cap, clock
        self._lock = threading.Lock()
        self.up = True
        self._delay = first
        self._next_try = 0.0

    def allow(self) -> bool:
        with self._lock:
            return self.up or self._clock() >= self._next_try

    def ok(self) -> bool:
        """Record a success; True when it ends an outage."""
        with self._lock:
            was_down, self.up, self._delay = not self.up, True, self.first
            return was_down

    def fail(self) -> None:
        with self._lock:
            delay = self._delay if not self.up else self.first
            self.up = False
            self._next_try = self._clock() + delay
            self._delay = min(delay * 2, self.cap)


class RedisTier:
    """StorageTier (and BatchTier) over one Redis server; thread-safe (redis-py's pool)."""

    name = "remote"

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "kvgate",
        password: str | None = None,
        timeout_s: float = 2.0,
        connect_timeout_s: float = 1.0,
        ttl_s: int | None = None,
        pool_size: int = 16,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        max_value_bytes: int = MAX_VALUE_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Connects lazily: an unreachable server is an outage (misses), not a start-up error.
        `clock` times the backoff (seconds; tests pass their own). Raises ValueError for a URL
        redis-py cannot parse or a bad number."""
        if not prefix or any(c.isspace() for c in prefix):
            raise ValueError(f"prefix must be a non-empty word, got {prefix!r}")
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError("timeouts must be > 0")
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError("ttl_s must be > 0 (or None: no expiry)")
        if pool_size < 1 or backoff_s <= 0 or max_backoff_s < backoff_s:
            raise ValueError("pool_size must be >= 1 and 0 < backoff_s <= max_backoff_s")
        self.prefix = f"{prefix}:"
        self.ttl_s = ttl_s
        self.max_value_bytes = max_value_bytes
        self._client = redis.Redis.from_url(
            url,
            password=password,
            socket_timeout=timeout_s,
            socket_connect_timeout=connect_timeout_s,
            max_connections=pool_size,
            retry=Retry(NoBackoff(), 0),  # our own backoff, not redis-py's retries
            decode_responses=False,
        )
        kw = self._client.connection_pool.connection_kwargs
        self._where = kw["path"] if "path" in kw else f"{kw.get('host')}:{kw.get('port')}"  # never the password
        self.backoff = Backoff(backoff_s, max_backoff_s, clock)
        self._failures = SoftFailures(log, f"remote KV tier {self._where}")
        self._lock = threading.Lock()  # guards the counters
        self.errors = {op: 0 for op in OPS}  # round trips that failed
        self.skipped = {op: 0 for op in OPS}  # operations not tried: Redis down, waiting out the backoff
        self.rejected = 0  # values bigger than max_value_bytes
        self.write_errors = 0  # values the server refused (OOM under noeviction, ...) or lost to an outage
        self._server: dict[str, int] = {"bytes": 0, "budget_bytes": 0, "evictions": 0, "items": 0}
        self._checked_policy = False

    # -- plumbing ---------------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return self.prefix + key

    def _count(self, table: dict[str, int], op: str) -> None:
        with self._lock:
            table[op] += 1

    def _call(self, op: str, fn: Callable[[], T], fallback: T) -> T:
        """fn() unless Redis is down (fallback, counted as skipped); a failure is counted, logged
        once per streak, and answered with `fallback`; a connection failure marks Redis down."""
        if not self.backoff.allow():
            self._count(self.skipped, op)
            return fallback
        try:
            out = fn()
        except _DOWN as exc:
            self.backoff.fail()
            self._count(self.errors, op)
            self._failures.failed(op, exc)
            return fallback
        except RedisError as exc:  # the server answered with an error: it is up
            self._count(self.errors, op)
            self._failures.failed(op, exc)
            return fallback
        if self.backoff.ok():
            log.info("remote KV tier %s is reachable again", self._where)
        self._failures.succeeded(op)
        if not self._checked_policy:
            self._check_policy()
        return out

    def _check_policy(self) -> None:
        """Warn once if the server will not keep within a memory limit by evicting (module doc)."""
        self._checked_policy = True
        try:
            info = self._client.info("memory")
        except RedisError:
            return
        limit, policy = int(info.get("maxmemory", 0)), str(info.get("maxmemory_policy", ""))
        if limit == 0 or policy == "noeviction":
            log.warning(
                "remote KV tier %s: maxmemory=%d policy=%s; set maxmemory and allkeys-lru so old chunks "
                "make room (otherwise Redis grows unbounded or refuses writes)",
                self._where,
                limit,
                policy,
            )

    # -- batch operations (one round trip each) ----------------------------------------------------

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is stored (one pipelined EXISTS per key); all False when down."""

        def run() -> list[bool]:
            pipe = self._client.pipeline(transaction=False)
            for k in keys:
                pipe.exists(self._key(k))
            return [bool(n) for n in pipe.execute()]

        return self._call("contains", run, [False] * len(keys)) if keys else []

    def get_many(self, keys: Sequence[str]) -> list[bytes]:
        """The values of the leading keys that are stored, cut at the first missing one (one
        pipelined GET / GETEX); empty when down."""

        def run() -> list[bytes]:
            pipe = self._client.pipeline(transaction=False)
            for k in keys:
                if self.ttl_s is None:
                    pipe.get(self._key(k))
                else:
                    pipe.getex(self._key(k), ex=self.ttl_s)
            out: list[bytes] = []
            for value in pipe.execute():
                if value is None:
                    break
                out.append(value)
            return out

        return self._call("get", run, []) if keys else []

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[bool]:
        """Store each (key, value) unless the key is present (SET NX: a present key counts as
        stored); one pipeline. False for a value too big, refused by the server, or not sent."""
        ok = [len(v) <= self.max_value_bytes for _, v in items]
        send = [(i, k, v) for i, (k, v) in enumerate(items) if ok[i]]
        with self._lock:
            self.rejected += len(items) - len(send)
        if not send:
            return ok

        def run() -> list[bool]:
            pipe = self._client.pipeline(transaction=False)
            for _, k, v in send:
                pipe.set(self._key(k), v, nx=True, ex=self.ttl_s)
            # per-command errors (OOM under noeviction) come back in place, not raised
            return [not isinstance(r, Exception) for r in pipe.execute(raise_on_error=False)]

        results = self._call("put", run, [False] * len(send))
        for (i, _, _), stored in zip(send, results):
            ok[i] = stored
        with self._lock:
            self.write_errors += results.count(False)
        return ok

    # -- StorageTier --------------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        found = self.get_many([key])
        return found[0] if found else None

    def put(self, key: str, data: bytes) -> bool:
        return self.put_many([(key, data)])[0]

    def contains(self, key: str) -> bool:
        return self.contains_many([key])[0]

    def delete(self, key: str) -> None:
        self._call("delete", lambda: self._client.delete(self._key(key)), 0)

    def keys(self) -> Iterator[str]:
        """This tier's keys (SCAN over the prefix: every replica's chunks, the whole shared tier)."""

        def run() -> list[str]:
            n = len(self.prefix)
            return [k.decode()[n:] for k in self._client.scan_iter(match=self.prefix + "*", count=1000)]

        return iter(self._call("keys", run, []))

    def clear(self) -> None:
        """Delete every key under the prefix (all replicas' chunks: the tier is shared)."""

        def run() -> None:
            batch: list[bytes] = []
            for k in self._client.scan_iter(match=self.prefix + "*", count=1000):
                batch.append(k)
                if len(batch) >= 1000:
                    self._client.unlink(*batch)
                    batch.clear()
            if batch:
                self._client.unlink(*batch)

        self._call("clear", run, None)

    def stats(self) -> dict[str, Any]:
        """items, bytes, budget_bytes, evictions: the server's (DBSIZE, used_memory, maxmemory,
        evicted_keys: the whole instance), the last known values while down; plus up,
        errors_by_op, skipped_by_op, rejected, write_errors."""

        def run() -> dict[str, int]:
            pipe = self._client.pipeline(transaction=False)
            pipe.info("memory")
            pipe.info("stats")
            pipe.dbsize()
            memory, stats, items = pipe.execute()
            return {
                "bytes": int(memory.get("used_memory", 0)),
                "budget_bytes": int(memory.get("maxmemory", 0)),
                "evictions": int(stats.get("evicted_keys", 0)),
                "items": int(items),
            }

        server = self._call("stats", run, None)
        with self._lock:
            if server is not None:
                self._server = server
            return {
                **self._server,
                "up": int(self.backoff.up),
                "errors_by_op": dict(self.errors),
                "skipped_by_op": dict(self.skipped),
                "rejected": self.rejected,
                "write_errors": self.write_errors,
            }

    def close(self) -> None:
        self._client.close()
