"""Request ids and what each request was served from, kept so feedback can act on them later.

`RequestLog` is the protocol; one implementation per store: `DiskRequestLog` here (store
backend `local`), `RedisRequestLog` (kvgate.middleware.cache.request_log_redis, backend `redis`: proxies on
several machines take feedback on each other's requests).

DiskRequestLog: records live in a diskcache next to the responses (`<cache_dir>/requests`), so every proxy
process on one cache dir can take feedback on a request another process served. The log is
bounded twice: each record expires after `ttl` seconds, and the whole log is culled
(least recently stored first) past `max_bytes`. Values are JSON; no prompts or keys are kept,
only ids, the tenant hash, the scope hash and the similarity.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import diskcache
import orjson

from kvgate.index.storage.disk_sql import CULL_EVERY, SECURE_DELETE, put_ints, scrub
from kvgate.index.storage.recover import open_cache
from kvgate.index.storage.softfail import Batch, SoftFailures, soft_transaction
from kvgate.index.storage.wal import WalCheckpointer
from kvgate.middleware.outcome import REQUEST_ID_PREFIX, new_request_id  # noqa: F401  (re-exported)

log = logging.getLogger("kvgate.request_log")

STORAGE_FAILURES = (sqlite3.Error, OSError, diskcache.Timeout)


@dataclass(frozen=True)
class RequestRecord:
    """What one chat completion was served from (hit) or stored as (miss)."""

    tenant: str
    route: str
    tier: str  # miss | exact | semantic
    scope: str
    entry_id: int | None  # the entry served (hit) or written (miss); None when nothing was stored
    similarity: float | None = None  # semantic hits only
    created: float = field(default_factory=time.time)

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "tenant": self.tenant,
                "route": self.route,
                "tier": self.tier,
                "scope": self.scope,
                "entry_id": self.entry_id,
                "similarity": self.similarity,
                "created": self.created,
            }
        )

    @classmethod
    def from_bytes(cls, raw: bytes) -> "RequestRecord":
        return cls(**json.loads(raw))


class RequestLog(Protocol):
    """request id → RequestRecord, shared by every proxy on one store. Storage trouble never
    raises: a record that cannot be written is skipped, a lookup that fails is None (counted in
    `stats()["storage_errors"]`)."""

    def record(self, request_id: str, record: RequestRecord) -> None: ...

    def get(self, request_id: str) -> RequestRecord | None:
        """The record of a request id, or None when unknown, expired, evicted or unreadable."""
        ...

    def batch(self) -> AbstractContextManager[Any]:
        """Records made inside commit together at its end, where the store has transactions
        (one commit costs more than the writes in it); a failed commit is counted, never raised."""
        ...

    def stats(self) -> dict[str, int]: ...

    def erase_tenant(self, tenant: str) -> int:
        """Delete every record of `tenant` (one pass over the log, which is bounded) and leave
        none readable in the store's files; how many. Unlike the calls above it raises storage
        failures: an erasure that did not finish must say so."""
        ...

    def close(self) -> None: ...


class DiskRequestLog:
    """request id → RequestRecord, bounded by age and size; safe across threads and processes."""

    def __init__(self, directory: str | Path, ttl: float, max_bytes: int) -> None:
        self.ttl = ttl
        self._directory = Path(directory)
        Path(directory).mkdir(parents=True, exist_ok=True)
        # a damaged database is moved aside; a full disk makes records no-ops (logged once), never errors
        self._disk = open_cache(
            Path(directory), log, size_limit=int(max_bytes), eviction_policy="least-recently-stored", **SECURE_DELETE
        )
        self._wal = WalCheckpointer(Path(directory) / diskcache.core.DBNAME, log)  # checkpoints off the request path
        self._soft = SoftFailures(log, f"request log {directory}")
        # Writers of this process take turns here: threads that met in SQLite's write lock would
        # back off in sleeps of up to 100 ms (its busy handler) while holding a worker thread.
        self._write = threading.RLock()  # reentrant: `record` inside `batch`
        # a batch's records, written in one statement at its end (None outside a batch; only the
        # thread holding `_write` sees it set)
        self._held: dict[str, bytes] | None = None
        self._unculled = 0  # records written without a cull since the last one

    def record(self, request_id: str, record: RequestRecord) -> None:
        try:
            with self._write:
                if self._held is not None:
                    self._held[request_id] = record.to_bytes()
                    return  # its outcome is the batch's
                self._disk.set(request_id, record.to_bytes(), expire=self.ttl)
        except STORAGE_FAILURES as exc:
            self._soft.failed("record", exc)
            return
        self._soft.succeeded("record")

    @contextlib.contextmanager
    def batch(self) -> Iterator[Batch]:
        with self._write, soft_transaction(self._disk.transact, self._soft, "record", STORAGE_FAILURES) as batch:
            outer, self._held = self._held, self._held if self._held is not None else {}
            try:
                yield batch
                if outer is None and self._held:
                    self._write_held(self._held)
            finally:
                self._held = outer
        if outer is None and self._unculled >= CULL_EVERY:
            self._cull()

    def _write_held(self, held: dict[str, bytes]) -> None:
        """A batch's records in one statement (inside its transaction: the commit reports them);
        a failure loses these records only, never the batch's other writes."""
        try:
            put_ints(self._disk, held, self.ttl)  # type: ignore[arg-type]
        except STORAGE_FAILURES as exc:
            self._soft.failed("record", exc)
            return
        self._unculled += len(held)

    def _cull(self) -> None:
        """Expired records out, then the least recently stored while over `max_bytes`."""
        try:
            with self._write:
                self._disk.cull()
                self._unculled = 0
        except STORAGE_FAILURES as exc:
            self._soft.failed("record", exc)

    def get(self, request_id: str) -> RequestRecord | None:
        """The record of a request id, or None when unknown, expired or culled."""
        if self._held is not None:  # a batch is open: its thread reads its own records
            with self._write:  # (another thread waits for the batch's end, then reads the disk)
                held = self._held.get(request_id) if self._held is not None else None
            if held is not None:
                return RequestRecord.from_bytes(held)
        try:
            raw = self._disk.get(request_id) if request_id.startswith(REQUEST_ID_PREFIX) else None
        except STORAGE_FAILURES as exc:
            self._soft.failed("lookup", exc)
            return None
        if raw is None:
            return None
        try:
            return RequestRecord.from_bytes(raw)
        except (ValueError, TypeError):  # damaged: treated as unknown
            return None

    def __len__(self) -> int:
        return len(self._disk)

    def erase_tenant(self, tenant: str) -> int:
        removed = 0
        for request_id in list(self._disk.iterkeys()):
            record = self.get(request_id) if isinstance(request_id, str) else None
            if record is not None and record.tenant == tenant:
                with self._write:
                    removed += bool(self._disk.delete(request_id))
        scrub(self._directory)
        return removed

    def stats(self) -> dict[str, int]:
        """`storage_errors`: records and lookups that failed softly (the request went on)."""
        return {"storage_errors": self._soft.total}

    def close(self) -> None:
        self._wal.close()
        self._disk.close()
