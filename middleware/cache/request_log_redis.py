"""RedisRequestLog: request id → RequestRecord in a shared Redis (store backend `redis`), so
feedback given to any proxy reaches a request another proxy served.

One key per request id, `<prefix>r:<request id>`, expiring after `ttl` (Redis's own expiry; the
size bound is Redis's `maxmemory`). Values are the record's JSON, sealed (kvgate.index.storage.sealed): a damaged
record reads as unknown. Storage trouble is counted and never raised (kvgate.index.storage.softfail).
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractContextManager
from typing import Any

import redis

from kvgate.index.storage.redis_link import RedisLink
from kvgate.index.storage.sealed import Damaged, seal, unseal
from kvgate.index.storage.softfail import SoftFailures
from kvgate.middleware.cache.request_log import REQUEST_ID_PREFIX, RequestRecord

log = logging.getLogger("kvgate.request_log")


def _batches(keys: list[Any], size: int = 1000) -> list[list[Any]]:
    return [keys[i : i + size] for i in range(0, len(keys), size)]


def _tenant_of(raw: bytes) -> str | None:
    try:
        return RequestRecord.from_bytes(unseal(raw)).tenant
    except (Damaged, ValueError, TypeError):
        return None


class RedisRequestLog:
    """RequestLog on Redis; shares the link (pool, circuit) of the response cache's store."""

    def __init__(self, link: RedisLink, key_prefix: str, ttl: float) -> None:
        self.link = link
        self.ttl_ms = max(1, int(ttl * 1000))
        self._prefix = f"{key_prefix}r:"
        self._soft = SoftFailures(log, f"request log {link.where}")

    def record(self, request_id: str, record: RequestRecord) -> None:
        try:
            self.link.run("record", lambda r: r.set(self._prefix + request_id, seal(record.to_bytes()), px=self.ttl_ms))
        except redis.exceptions.RedisError as exc:
            self._soft.failed("record", exc)
            return
        self._soft.succeeded("record")

    def get(self, request_id: str) -> RequestRecord | None:
        if not request_id.startswith(REQUEST_ID_PREFIX):
            return None
        try:
            raw = self.link.run("lookup", lambda r: r.get(self._prefix + request_id))
        except redis.exceptions.RedisError as exc:
            self._soft.failed("lookup", exc)
            return None
        self._soft.succeeded("lookup")
        if raw is None:
            return None
        try:
            return RequestRecord.from_bytes(unseal(raw))
        except (Damaged, ValueError, TypeError):  # damaged: treated as unknown
            return None

    def batch(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()  # each record is one SET: nothing to group

    def stats(self) -> dict[str, int]:
        return {"storage_errors": self._soft.total}

    def erase_tenant(self, tenant: str) -> int:
        removed = 0
        for keys in _batches(self.link.run("scan", lambda r: list(r.scan_iter(match=self._prefix + "*", count=1000)))):
            values = self.link.run("scan", lambda r, k=keys: r.mget(k))
            mine = [k for k, raw in zip(keys, values) if raw is not None and _tenant_of(raw) == tenant]
            if mine:
                removed += int(self.link.run("delete", lambda r, m=mine: r.unlink(*m)))
        return removed

    def close(self) -> None:
        """The link is the store's: it closes it."""
