"""What kvgate asks of a diskcache directory's SQLite database directly: a range of keys, deletes
that leave nothing readable, and a scrub of the write-ahead log.

diskcache's own API lists keys only by walking all of them; its table keeps a unique index on
(key, raw), so a range of string keys is one indexed query instead (diskcache 5's schema: table
`Cache`, string keys stored as TEXT with raw = 1, `expire_time` in epoch seconds).

Deleting a row does not erase its bytes by itself: SQLite leaves them in the page and in free
pages unless `secure_delete` is on (some builds turn it on by default, not all). A store that must
be able to forget opens its cache with SECURE_DELETE (diskcache applies the pragma to every
connection it opens, in every process), so freed content is overwritten with zeros. In WAL mode
the write-ahead log still holds pages as they were before: `scrub` truncates it (a TRUNCATE
checkpoint, which copies the log into the database first), so a raw read of the directory then
finds only live rows. Large values are files of their own, which diskcache removes with the row.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import diskcache

SCRUB_WAIT_S = 5.0  # a reader in another process may hold the log for a moment
SECURE_DELETE = {"sqlite_secure_delete": 1}  # open_cache(..., **SECURE_DELETE): deleted content is zeroed


def keys_between(cache: diskcache.Cache, low: str, high: str) -> list[str]:
    """The live string keys k with low <= k < high, in order."""
    rows = cache._sql(  # noqa: SLF001  (the indexed query diskcache has no public call for)
        "SELECT key FROM Cache WHERE raw = 1 AND key >= ? AND key < ? AND (expire_time IS NULL OR expire_time > ?) ORDER BY key",
        (low, high, time.time()),
    ).fetchall()
    return [key for (key,) in rows if isinstance(key, str)]


def scrub(directory: Path, wait_s: float = SCRUB_WAIT_S) -> bool:
    """Truncate the directory's write-ahead log once it is copied into the database; False when a
    reader kept the log busy past `wait_s` (its old pages may then still hold deleted rows)."""
    conn = sqlite3.connect(str(Path(directory) / diskcache.core.DBNAME), timeout=30, isolation_level=None)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
    finally:
        conn.close()
