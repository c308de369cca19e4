"""DiskEpochStore: the tenants' salt records (kvgate.middleware.routing.epochs) in a diskcache dir
(`<cache_dir>/tenants`), shared by the processes of one machine. Keys: "t:<tenant digest>" →
"<epoch>:<nonce hex>", "gen" → the generation counter; "e:<tenant digest>" is the erasure counter
of a version without nonces, read to number the tenant's first record. The cache is opened with
secure deletes and its write-ahead log truncated after an erasure (kvgate.index.storage.disk_sql),
so an overwritten nonce stays neither in the database's pages nor in the log. Opened on first use,
so a pipeline that never salts nor erases creates nothing."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import diskcache

from kvgate.index.storage.disk_sql import SECURE_DELETE, scrub
from kvgate.index.storage.recover import open_cache
from kvgate.middleware.routing.epochs import TenantSalt

log = logging.getLogger("kvgate.salt")


class DiskEpochStore:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.where = str(self.directory)
        self.failures: tuple[type[BaseException], ...] = (sqlite3.Error, OSError, diskcache.Timeout)
        self._cache: diskcache.Cache | None = None
        self._lock = threading.Lock()

    def _open(self, create: bool) -> diskcache.Cache | None:
        """The diskcache, opened once; None while it does not exist and `create` is off (reads
        alone never create the directory: nothing was ever salted here)."""
        with self._lock:
            if self._cache is None:
                if not create and not (self.directory / diskcache.core.DBNAME).exists():
                    return None
                self.directory.mkdir(parents=True, exist_ok=True)
                self._cache = open_cache(self.directory, log, eviction_policy="none", **SECURE_DELETE)
            return self._cache

    def generation(self) -> int:
        cache = self._open(create=False)
        return int(cache.get("gen", 0) or 0) if cache is not None else 0

    def records(self, digests: list[str]) -> dict[str, TenantSalt]:
        cache = self._open(create=False)
        if cache is None:
            return {}
        found = {d: TenantSalt.decode(cache.get(f"t:{d}")) for d in digests}
        return {d: record for d, record in found.items() if record is not None}

    def get_or_create(self, digest: str, nonce: bytes) -> TenantSalt:
        cache = self._open(create=True)
        assert cache is not None
        with cache.transact():
            record = TenantSalt.decode(cache.get(f"t:{digest}"))
            if record is None:
                record = TenantSalt(int(cache.get(f"e:{digest}", 0) or 0), nonce)
                cache.set(f"t:{digest}", record.encode())
        return record

    def bump(self, digest: str, nonce: bytes) -> TenantSalt:
        cache = self._open(create=True)
        assert cache is not None
        with cache.transact():
            old = TenantSalt.decode(cache.get(f"t:{digest}"))
            epoch = old.epoch if old is not None else int(cache.get(f"e:{digest}", 0) or 0)
            record = TenantSalt(epoch + 1, nonce)
            cache.set(f"t:{digest}", record.encode())  # in place: secure_delete zeroes what it replaced
            cache.incr("gen")
        return record

    def scrub(self) -> bool:
        return self._open(create=False) is None or scrub(self.directory)

    def close(self) -> None:
        with self._lock:
            if self._cache is not None:
                self._cache.close()
                self._cache = None
