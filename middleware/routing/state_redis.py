"""RedisRoutingHub: the routing state of several proxies, on several machines, sharing one Redis.

One hub per proxy process (every route's RoutingState is a view of it), one background thread
that talks to Redis every `store.routing.sync_s`; the event loop never waits on Redis:

* Load. `add_load` changes this proxy's own counts in memory. Each sync pushes them as one hash
  per proxy, ``<prefix>route:load:<proxy id>`` (field ``route\\0replica`` → ``in_flight,pending``),
  with a `load_ttl_s` expiry refreshed at every push, and registers the id in the set
  ``<prefix>route:proxies``; then it reads every other registered proxy's hash (one pipelined
  round trip) into a local snapshot. `load` = this proxy's own counts (never stale) + the
  snapshot. A proxy that dies stops refreshing its hash: Redis expires it within `load_ttl_s`
  and the others drop its id from the set. The others' part is at most about 2 × `sync_s` old
  (their push, then our read) while Redis answers; when no read succeeded for `load_ttl_s`
  (Redis down), the snapshot is dropped and `load` is this proxy's own counts.

* Routing decisions. `recorded` queues ``(route, replica, hashes)`` (msgpack) in a bounded
  outbox; each sync appends the queue to one Redis Stream, ``<prefix>route:log`` (capped near
  `log_max` entries, expiring `log_ttl_s` after its last write), and reads the entries added
  since the last one this proxy saw, applying the other proxies' to its own prefix index (the
  `follow` callback). A proxy that starts reads the stream from its beginning: it learns the
  last `log_max` decisions. Why a stream of records rather than llm-d's layout (one hash per
  block, fields = replicas, looked up at routing time): with a followed log every routing
  decision matches against the local index, with no round trip on the request path, and one
  pipelined read per sync carries every proxy's news; a per-block key would cost a round trip
  per request (or a second, staler cache of it). The price is that each proxy keeps a full
  index in memory — which it already does in approximate mode.

Redis down: each sync fails fast (kvgate.index.storage.redis_link's circuit backs off; failures are counted per
op in kvgate_store_errors_total{op="routing_push"|"routing_read"}), routing goes on from the
local index and this proxy's own load, records wait in the bounded outbox (the oldest dropped
when full: a lost record costs a prefill, never a wrong answer), and sharing resumes at the first
sync that gets through. Stream ids are Redis server times, so after a restart of an empty Redis
new entries still sort after the last id a follower saw.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable, Sequence

import msgspec
import redis

from kvgate.index.storage.redis_link import RedisLink
from kvgate.middleware.config import Config
from kvgate.middleware.routing.state import ApplyRecord
from kvgate.middleware.store_config import SharedRoutingConfig

log = logging.getLogger("kvgate.routing.redis")

OUTBOX_MAX = 10_000  # records waiting for a sync (Redis slow or down); the oldest are dropped
PUSH_BATCH = 2_000  # records appended per sync
READ_BATCH = 2_000  # records read per sync (a late starter catches up over a few syncs)


def _slot(route: str, replica: str) -> str:
    return f"{route}\x00{replica}"


def sum_loads(hashes: Sequence[dict[bytes, bytes]]) -> dict[str, tuple[int, int]]:
    """Per slot, (in flight, pending tokens) summed over the given proxies' load hashes.

    Invariant: a malformed field or value counts as zero load, never raises (another proxy's
    bad write must not stop this one's routing)."""
    out: dict[str, list[int]] = {}
    for fields in hashes:
        for key, value in fields.items():
            try:
                a, b = value.split(b",", 1)
                counts = out.setdefault(key.decode(), [0, 0])
                counts[0] += int(a)
                counts[1] += int(b)
            except (ValueError, UnicodeDecodeError):
                continue
    return {k: (v[0], v[1]) for k, v in out.items()}


class RedisRoutingHub:
    """One proxy's end of the shared routing view (see the module docstring); thread-safe."""

    def __init__(
        self,
        link: RedisLink,
        key_prefix: str,
        cfg: SharedRoutingConfig,
        *,
        proxy_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._link, self._cfg, self._clock = link, cfg, clock
        self.proxy_id = proxy_id or uuid.uuid4().hex[:16]
        self._load_key = f"{key_prefix}route:load:{self.proxy_id}"
        self._load_prefix = f"{key_prefix}route:load:"
        self._proxies_key = f"{key_prefix}route:proxies"
        self._log_key = f"{key_prefix}route:log"
        self._lock = threading.Lock()  # own counts: written on the loop, read by the sync thread
        self._own: dict[str, list[int]] = {}
        self._others: dict[str, tuple[int, int]] = {}
        self._others_at: float | None = None  # clock() of the last successful read
        self._outbox: deque[bytes] = deque(maxlen=OUTBOX_MAX)
        self._apply: dict[str, ApplyRecord] = {}
        self._last_id = b"0-0"  # a new proxy reads the whole (bounded) stream: the recent history
        self._gone: set[bytes] = set()  # proxies whose load hash expired: removed from the set next push
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(tuple[str, str, list[int]])
        self.received = 0  # other proxies' records applied (tests, logs)
        self.syncs = 0  # syncs that got through (tests, logs)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvgate-routing-redis", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the RoutingState side
    def state(self, route: str, replicas: Sequence[str]) -> "RedisState":
        """The StateFactory of a proxy on Redis: one RedisState per route."""
        with self._lock:
            for name in replicas:
                self._own.setdefault(_slot(route, name), [0, 0])
        return RedisState(self, route)

    def add_load(self, slot: str, in_flight: int, pending: int) -> None:
        with self._lock:
            counts = self._own.setdefault(slot, [0, 0])
            counts[0] += in_flight
            counts[1] += pending

    def load(self, slot: str) -> tuple[int, int]:
        with self._lock:
            own = self._own.get(slot, (0, 0))
            fresh = self._others_at is not None and self._clock() - self._others_at <= self._cfg.load_ttl_s
            other = self._others.get(slot, (0, 0)) if fresh else (0, 0)
        return own[0] + other[0], own[1] + other[1]

    def publish(self, route: str, replica: str, hashes: Sequence[int]) -> None:
        self._outbox.append(self._encoder.encode((route, replica, list(hashes))))

    def follow(self, route: str, apply: ApplyRecord) -> None:
        self._apply[route] = apply

    # ------------------------------------------------------------------ the sync thread
    def _run(self) -> None:
        while not self._stop.wait(self._cfg.sync_s):
            self.sync()

    def sync(self) -> bool:
        """One push + read; False when Redis did not answer (counted by the link, never raised)."""
        try:
            members = self._push()
            self._read(members)
        except redis.exceptions.RedisError:
            return False
        except Exception:  # a bug here must not kill the thread: the proxy would route alone forever
            log.exception("routing sync failed")
            return False
        self.syncs += 1
        return True

    def _push(self) -> list[bytes]:
        with self._lock:
            own = {k: f"{v[0]},{v[1]}" for k, v in self._own.items()}
        batch = list(itertools.islice(self._outbox, PUSH_BATCH))
        gone, self._gone = self._gone, set()
        ttl_ms, log_ttl_ms = int(self._cfg.load_ttl_s * 1000), int(self._cfg.log_ttl_s * 1000)

        def push(r: redis.Redis) -> list[Any]:
            pipe = r.pipeline(transaction=False)
            if own:
                pipe.hset(self._load_key, mapping=own)
                pipe.pexpire(self._load_key, ttl_ms)
            pipe.sadd(self._proxies_key, self.proxy_id)
            if gone:
                pipe.srem(self._proxies_key, *gone)
            pipe.pexpire(self._proxies_key, log_ttl_ms)
            for payload in batch:
                pipe.xadd(
                    self._log_key, {b"p": self.proxy_id, b"r": payload}, maxlen=self._cfg.log_max, approximate=True
                )
            if batch:
                pipe.pexpire(self._log_key, log_ttl_ms)
            pipe.smembers(self._proxies_key)
            return pipe.execute()

        try:
            out = self._link.run("routing_push", push)
        except redis.exceptions.RedisError:
            self._gone |= gone
            raise
        for _ in batch:  # sent: drop them (a record pushed out by a full outbox meanwhile is simply lost)
            if self._outbox:
                self._outbox.popleft()
        return sorted(m for m in out[-1] if m != self.proxy_id.encode())

    def _read(self, members: list[bytes]) -> None:
        def read(r: redis.Redis) -> list[Any]:
            pipe = r.pipeline(transaction=False)
            for m in members:
                pipe.hgetall(self._load_prefix + m.decode())
            pipe.xread({self._log_key: self._last_id}, count=READ_BATCH)
            return pipe.execute()

        out = self._link.run("routing_read", read)
        loads: list[dict[bytes, bytes]] = out[:-1]
        self._gone |= {m for m, fields in zip(members, loads) if not fields}  # expired: a dead proxy
        others = sum_loads(loads)
        with self._lock:
            self._others, self._others_at = others, self._clock()
        for _stream, entries in out[-1] or []:
            for entry_id, fields in entries:
                self._last_id = entry_id
                if fields.get(b"p") != self.proxy_id.encode():
                    self._apply_one(fields.get(b"r", b""))

    def _apply_one(self, payload: bytes) -> None:
        try:
            route, replica, hashes = self._decoder.decode(payload)
        except msgspec.DecodeError:  # another version's or a damaged record: skip it
            return
        apply = self._apply.get(route)
        if apply is not None:
            apply(replica, hashes)
            self.received += 1

    def close(self) -> None:
        """Stop syncing and remove this proxy's load at once (a dead proxy's expires instead)."""
        self._stop.set()
        self._thread.join(2.0)
        try:
            self._link.run(
                "routing_push",
                lambda r: (
                    r.pipeline(transaction=False)
                    .delete(self._load_key)
                    .srem(self._proxies_key, self.proxy_id)
                    .execute()
                ),
            )
        except redis.exceptions.RedisError:
            pass  # Redis down: the hash expires by itself


class RedisState:
    """One route's RoutingState on a proxy sharing Redis (see the module docstring)."""

    shared = True

    def __init__(self, hub: RedisRoutingHub, route: str) -> None:
        self._hub, self._route = hub, route

    def add_load(self, replica: str, in_flight: int, pending_tokens: int) -> None:
        self._hub.add_load(_slot(self._route, replica), in_flight, pending_tokens)

    def load(self, replica: str) -> tuple[int, int]:
        return self._hub.load(_slot(self._route, replica))

    def recorded(self, replica: str, hashes: Sequence[int]) -> None:
        self._hub.publish(self._route, replica, hashes)

    def follow(self, apply: ApplyRecord) -> None:
        self._hub.follow(self._route, apply)

    def close(self) -> None:
        pass  # the hub is the proxy's, closed once by its Pipeline


def shared_routing(config: Config, link: RedisLink | None) -> RedisRoutingHub | None:
    """The proxy's hub when its store is Redis (`link`), else None (routing state stays local,
    or the workers' hub of `kvgate serve --workers N`). With Redis and several workers, each
    worker is one more proxy on Redis: Redis already shares between every process on every host."""
    if link is None or config.store.backend != "redis" or not any(r.replicas for r in config.routes):
        return None  # nothing routed: no thread, no traffic
    return RedisRoutingHub(link, config.store.key_prefix, config.store.routing)
