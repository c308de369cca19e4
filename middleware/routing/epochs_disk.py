"""DiskEpochStore: salt epochs in a diskcache dir (`<cache_dir>/tenants`), shared by the processes
of one machine. Keys: "e:<tenant digest>" → epoch, "gen" → the generation counter. Opened on first
use, so a pipeline that never salts nor erases creates nothing."""
from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import diskcache

from kvgate.index.storage.recover import open_cache

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
        alone never create the directory: nothing was ever erased here)."""
        with self._lock:
            if self._cache is None:
                if not create and not (self.directory / diskcache.core.DBNAME).exists():
                    return None
                self.directory.mkdir(parents=True, exist_ok=True)
                self._cache = open_cache(self.directory, log, eviction_policy="none")
            return self._cache

    def generation(self) -> int:
        cache = self._open(create=False)
        return int(cache.get("gen", 0) or 0) if cache is not None else 0

    def epochs(self) -> dict[str, int]:
        cache = self._open(create=False)
        if cache is None:
            return {}
        return {k[2:]: int(cache.get(k, 0) or 0) for k in cache.iterkeys() if isinstance(k, str) and k.startswith("e:")}

    def bump(self, digest: str) -> int:
        cache = self._open(create=True)
        assert cache is not None
        with cache.transact():
            epoch = int(cache.incr(f"e:{digest}"))
            cache.incr("gen")
        return epoch

    def close(self) -> None:
        with self._lock:
            if self._cache is not None:
                self._cache.close()
                self._cache = None
