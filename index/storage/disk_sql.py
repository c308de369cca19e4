"""What kvgate asks of a diskcache directory's SQLite database directly: a range of keys, deletes
that leave nothing readable, and a scrub of the write-ahead log.

diskcache's own API lists keys only by walking all of them, and its `set` runs three statements per
key (look-up, write, cull of expired rows); its table keeps a unique index on
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
from itertools import compress, repeat
from operator import is_
from pathlib import Path

import diskcache

_PUT_INT = (
    "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, size, mode, filename, value)"
    " VALUES (?, 1, ?, ?, ?, 0, NULL, 0, 1, NULL, ?)"
    " ON CONFLICT(key, raw) DO UPDATE SET store_time = excluded.store_time, expire_time = excluded.expire_time,"
    " access_time = excluded.access_time, access_count = 0, tag = NULL, size = 0, mode = 1, filename = NULL,"
    " value = excluded.value"
)
_GET_RAW = "SELECT value FROM Cache WHERE key = ? AND raw = 1 AND mode = 1 AND (expire_time IS NULL OR expire_time > ?)"
# rows written by `put_ints` between two culls of expired rows (diskcache's `set` culls on every
# write): a store's expired rows and size bound lag by at most this many writes
CULL_EVERY = 64
SCRUB_WAIT_S = 5.0  # a reader in another process may hold the log for a moment
SECURE_DELETE = {"sqlite_secure_delete": 1}  # open_cache(..., **SECURE_DELETE): deleted content is zeroed


def keys_between(cache: diskcache.Cache, low: str, high: str) -> list[str]:
    """The live string keys k with low <= k < high, in order."""
    rows = cache._sql(  # noqa: SLF001  (the indexed query diskcache has no public call for)
        "SELECT key FROM Cache WHERE raw = 1 AND key >= ? AND key < ? AND (expire_time IS NULL OR expire_time > ?) ORDER BY key",
        (low, high, time.time()),
    ).fetchall()
    return [key for (key,) in rows if isinstance(key, str)]


def get_int(cache: diskcache.Cache, key: str) -> int | None:
    """The live integer value of string key `key` (as `put_ints` or `set` store an int), or None
    when it is absent, expired or not an integer. One indexed read: `cache.get` reads the same
    row with more Python around it (its fetch, statistics and retry options)."""
    row = cache._con.execute(_GET_RAW, (key, time.time())).fetchone()  # noqa: SLF001  (see keys_between)
    return row[0] if row is not None and type(row[0]) is int else None


def put_ints(cache: diskcache.Cache, items: dict[str, int | bytes], expire: float | None) -> None:
    """Write string keys with integer values (pointers, index rows), or bytes values shorter
    than the cache's `min_file_size`, in one statement, as `set` would store them (kept raw in
    the row: mode 1, no file, size 0; a longer bytes value is a ValueError, since `set` would
    give it a file of its own). Call it inside the cache's `transact()` with the rows it belongs
    with. Its keys are new or hold rows of this kind (a row whose value is a file of its own
    would leave the file behind: `set` replaces those). It culls nothing: the caller culls
    expired rows (`set` calls around it, `cache.expire()` or `cache.cull()`)."""
    limit = cache.disk.min_file_size
    values = items.values()  # the longest bytes value, found at C speed (a row per request path write)
    if max(map(len, compress(values, map(is_, map(type, values), repeat(bytes)))), default=0) >= limit:
        raise ValueError(f"put_ints writes bytes values shorter than {limit} bytes")
    now = time.time()
    expire_time = None if expire is None else now + expire
    cache._con.executemany(  # noqa: SLF001  (the batched write diskcache has no public call for)
        _PUT_INT, zip(items, repeat(now), repeat(expire_time), repeat(now), values)
    )


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
