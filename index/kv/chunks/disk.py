"""DiskTier: encoded chunks as files in a diskcache directory, LRU-evicted under a byte budget.

diskcache keeps one SQLite row per key (with the value's file name and access time) and the
value itself in its own file. Two properties matter here:

* Crash safety. `add` writes the value file completely *before* the transaction that inserts
  the row, and a key is only visible through its committed row; so a process killed mid-write
  leaves at worst an orphan file that no key points to, never a readable half-chunk. (A power
  loss can still leave a committed row over a short file, since nothing is fsync'ed: the
  codec's checksum turns that into a detected CorruptChunk, not wrong data.)
* Sharing. Several processes (replicas on one host, a restarted replica) may open the same
  directory; SQLite's locking keeps the rows consistent and `add` is atomic per key. They must
  agree on the budget: diskcache stores size_limit in the directory, the last opener's wins.

Eviction is driven here rather than inside diskcache's `add` (cull_limit=0): after each put
that leaves the directory over budget, `_shrink` evicts least recently used rows one by one
until it fits, so exactly as much as needed goes and we can count it for
`stats()["evictions"]` and report the keys to `watch_evictions` callbacks (this process's
evictions only: a replica sharing the directory does not hear of another process's).
"""

from __future__ import annotations

import io
import logging
import os
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import diskcache

from kvgate.index.kv.chunks.codec import CorruptChunk
from kvgate.index.storage.softfail import SoftFailures

log = logging.getLogger("kvgate.chunks.disk")


READ_BLOCK = 512 << 10
READERS = 8  # read_many's files in flight


def _read_all(f: BinaryIO) -> bytearray:
    """The file's bytes in one preallocated buffer: one kernel copy, no resizing or joins.

    Read in READ_BLOCK pieces, not one 12 MB read: from a cold page cache that lets the kernel's
    readahead run ahead of the copying, which one large read does not."""
    size = os.fstat(f.fileno()).st_size
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = f.readinto(view[got : got + READ_BLOCK])
        if not n:  # shrank under us: hand back what is there; the codec rejects it as truncated
            del view
            del buf[got:]
            return buf
        got += n
    return buf


class DiskTier:
    """Byte store in a diskcache directory; thread- and multi-process-safe.

    Invariant: after a `put` returns, the directory's volume (SQLite pages + value files, as
    diskcache counts it) is at most `budget_bytes` (unless a lock timeout cut eviction short; the
    next put resumes it), least recently *read or written* keys evicted first. Orphan files left
    by killed writers are not counted in that volume.
    """

    name = "disk"

    def __init__(self, directory: str | Path, budget_bytes: int, *, timeout: float = 10.0) -> None:
        """timeout: seconds to wait for SQLite's lock before a put gives up (returns False) or a
        get reports a miss; diskcache's default of 60 s is too long for a request path."""
        if budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0")
        self.directory = Path(directory)
        self.budget_bytes = budget_bytes
        self._cache = diskcache.Cache(
            str(self.directory),
            timeout=timeout,
            size_limit=budget_bytes,
            eviction_policy="least-recently-used",
            cull_limit=0,  # we cull after put (see module docstring)
            disk_min_file_size=0,  # every value is a file, never a BLOB inside SQLite
            statistics=False,
        )
        self._lock = threading.Lock()  # guards the counters only; diskcache is thread-safe
        self.evictions = 0
        self.rejected = 0  # value alone bigger than the budget
        self.write_errors = 0  # disk full, I/O error, lock timeout on put
        self.timeouts = 0  # lock timeouts on get (reported as misses)
        self.read_errors = 0  # value file could not be read (reported as misses)
        self._write_log = SoftFailures(
            log, f"disk tier {self.directory}"
        )  # a full disk: one warning, not one per chunk
        self._watchers: list[Callable[[list[str]], None]] = []
        self._readers: ThreadPoolExecutor | None = None  # read_many's, made on first use

    def watch_evictions(self, callback: Callable[[list[str]], None]) -> None:
        """Call `callback(keys)` after a put evicted `keys` (in the putting thread). Only this
        process's evictions are reported; deletes and clears are not evictions."""
        self._watchers.append(callback)

    def _count(self, counter: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + n)

    def get(self, key: str) -> bytes | None:
        """The stored bytes (a fresh bytearray that decode_chunk takes over without a copy) or
        None; raises CorruptChunk when the key's row exists but its value
        file is gone (deleted behind diskcache's back), so the caller can drop the dead row."""
        try:
            # read=True: the transaction (LRU access-time update) only opens the file; the MB-sized
            # read happens after it commits, so readers do not hold SQLite's write lock while reading.
            # An open handle keeps working if another process evicts the file meanwhile.
            found = self._cache.get(key, read=True, retry=False)
        except diskcache.Timeout:
            self._count("timeouts")
            return None
        if found is None:
            if self.contains(key):
                raise CorruptChunk(f"chunk {key!r}: row present in {self.directory} but its value file is missing")
            return None
        if isinstance(found, bytes):  # a value stored inline by another configuration
            return found
        try:
            with found:
                return _read_all(found)
        except OSError as e:  # EIO, EMFILE…: a miss (the caller recomputes), not proof of damage
            self._count("read_errors")
            log.warning("disk tier: could not read %s: %s", key, e)
            return None

    def read_many(self, keys: list[str]) -> list[bytearray | bytes]:
        """`get` of each key, READERS files at a time, up to the first that is missing (or whose
        row has lost its file: a later `get` reports that one). A queue of reads keeps a fast
        disk busy where one sequential reader would leave it idle between files."""
        if len(keys) < 2:
            found = self._get_or_none(keys[0]) if keys else None
            return [found] if found is not None else []
        with self._lock:
            if self._readers is None:
                self._readers = ThreadPoolExecutor(READERS, thread_name_prefix="kvgate-disk-read")
            pool = self._readers
        out: list[bytearray | bytes] = []
        for found in pool.map(self._get_or_none, keys):
            if found is None:
                break
            out.append(found)
        return out

    def _get_or_none(self, key: str) -> bytearray | bytes | None:
        try:
            return self.get(key)
        except CorruptChunk:
            return None

    def put(self, key: str, data: bytes) -> bool:
        if len(data) > self.budget_bytes:
            self._count("rejected")
            return False
        try:
            # as a file object: diskcache then writes it in 4 MiB pieces (bytes it would write line by
            # line, thousands of small writes per binary chunk, all holding the GIL)
            self._cache.add(key, io.BytesIO(data), read=True, retry=False)  # False when present: kept
        except (OSError, sqlite3.Error, diskcache.Timeout) as e:
            # ENOSPC mid-write leaves a partial, row-less file: unreachable, never read as a chunk
            self._count("write_errors")
            self._write_log.failed("store", e)
            return False
        self._write_log.succeeded("store")
        if self._cache.volume() > self.budget_bytes:
            self._shrink()
            return self.contains(key)  # a budget too small for the SQLite pages + data evicts it too
        return True

    def _shrink(self) -> None:
        """Evict least recently used rows one at a time until within budget.

        Not diskcache's `cull()`: that deletes rows in batches of 10 (so one byte over budget
        drops ten 12 MB chunks, the one just added among them when fewer than ten are stored).
        This is the same transaction diskcache's cull runs, with LIMIT 1; it uses diskcache's
        private `_transact`/schema (stable since 4.x; tests pin the behaviour). Files of deleted
        rows are removed after the commit, as in diskcache.
        """
        evicted: list[str] = []
        try:
            while self._cache.volume() > self.budget_bytes:
                with self._cache._transact(retry=False) as (sql, cleanup):
                    rows = sql("SELECT rowid, filename, key FROM Cache ORDER BY access_time LIMIT 1").fetchall()
                    if not rows:
                        break
                    ((rowid, filename, key),) = rows
                    sql("DELETE FROM Cache WHERE rowid = ?", (rowid,))
                    cleanup(filename)
                evicted.append(key)
        except diskcache.Timeout:
            pass  # the next put continues; the budget is briefly exceeded, nothing is lost
        finally:
            self._count("evictions", len(evicted))
        if evicted:
            keys = [k for k in evicted if isinstance(k, str)]  # our keys are str (diskcache stores them raw)
            for watch in self._watchers:
                watch(keys)

    def contains(self, key: str) -> bool:
        return key in self._cache

    def delete(self, key: str) -> None:
        self._cache.delete(key, retry=True)

    def keys(self) -> Iterator[str]:
        return iter(list(self._cache.iterkeys()))

    def clear(self) -> None:
        self._cache.clear(retry=True)

    def stats(self) -> dict[str, int]:
        return {
            "items": len(self._cache),
            "bytes": self._cache.volume(),
            "budget_bytes": self.budget_bytes,
            "evictions": self.evictions,
            "rejected": self.rejected,
            "write_errors": self.write_errors,
            "timeouts": self.timeouts,
            "read_errors": self.read_errors,
        }

    def close(self) -> None:
        with self._lock:
            readers, self._readers = self._readers, None
        if readers is not None:
            readers.shutdown(wait=True)
        self._cache.close()
