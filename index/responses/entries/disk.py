"""DiskEntryStore: the response cache's entries in one diskcache directory (SQLite + value files),
shared by every process that opens the directory.

Layout (no pickle anywhere: keys are str, values bytes or ints):
  "e:<id>"    entry JSON (CacheEntry.to_bytes)
  "v:<id>"    the question's unit vector, raw float32 bytes (absent for exact-only entries)
  "x:<key>"   exact request hash → id
  "next_id"   the id counter (diskcache's atomic incr): ids stay unique across processes and restarts
  "d:<seq>"   ids deleted, counter "del_seq", kept DELETE_LOG_TTL_S: the change log's deletions
  "t:<scope>" tightening marks from wrong-hit feedback (kvgate.index.responses.tighten), JSON
  "g:<term>|<id>"  1: the entry filed under an index term (a tag or its tenant's term,
              kvgate.index.responses.tags), written and expiring with the entry, deleted with it;
              `tagged` reads a term's rows as one range of the table's key index
The change log needs nothing more: ids added are the counter's range since the last look.

Every bytes value is sealed (kvgate.index.storage.sealed.SealedDisk: magic + SHA-256, checked on every read), so
a damaged item reads as absent and is counted in `damaged`. With a cipher
(kvgate.index.storage.cipher.EntryCipher) entries, vectors and marks are also encrypted under
their scope's key, inside the seal; one that fails authentication is damage too (and counted by
the cipher). A database that fails SQLite's
quick_check on open is moved aside (kvgate.index.storage.recover) and the store starts empty. TTL is diskcache's
own per-key expiry: an expired entry is never read. diskcache never evicts by itself here; the
budgets are SemanticIndex's (kvgate.index.responses.eviction).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import diskcache
import numpy as np

from kvgate.index.responses.entries.base import CacheEntry, Stored
from kvgate.index.responses.tags import index_terms
from kvgate.index.responses.tighten import Mark, decode_marks, encode_marks
from kvgate.index.storage.cipher import EntryCipher, open_with, seal_with
from kvgate.index.storage.disk_sql import CULL_EVERY, SECURE_DELETE, get_int, keys_between, put_ints, scrub
from kvgate.index.storage.recover import open_cache
from kvgate.index.storage.sealed import SEAL_BYTES, SealedDisk, seal
from kvgate.index.storage.wal import WalCheckpointer

log = logging.getLogger("kvgate.semantic")
DELETE_LOG_TTL_S = 3600.0


def _exact_key_of(raw: bytes | None) -> str | None:
    """The exact key recorded in an entry's JSON, if it can be read (to unpoint a damaged entry)."""
    if raw is None:
        return None
    try:
        key = json.loads(raw).get("exact_key")
    except (ValueError, AttributeError):
        return None
    return key if isinstance(key, str) else None


def _terms_of(raw: bytes | None) -> list[str]:
    """The index terms of an entry's JSON, if it can be read (to delete its index rows)."""
    try:
        row = json.loads(raw) if raw is not None else {}
        return index_terms(row.get("tags"), row.get("tenant"))
    except (ValueError, AttributeError, TypeError):
        return []


class DiskEntryStore:
    """EntryStore on a diskcache directory; one handle per process, any number of processes."""

    def __init__(self, directory: str | Path, dim: int, cipher: EntryCipher | None = None) -> None:
        self.directory = Path(directory)
        self.cipher = cipher
        self.directory.mkdir(parents=True, exist_ok=True)
        self.dim = dim
        self.where = str(self.directory)
        self.failures: tuple[type[BaseException], ...] = (sqlite3.Error, OSError, diskcache.Timeout)
        # eviction is the caller's (LRU, budgets, TTL heap); diskcache must never drop entries on its own
        self.cache = open_cache(
            self.directory, log, eviction_policy="none", size_limit=2**62, disk=SealedDisk, **SECURE_DELETE
        )  # a deleted answer leaves no bytes behind (kvgate.index.storage.disk_sql)
        # answers are stored before a stream's [DONE]: the WAL's checkpoints happen off that path
        self._wal = WalCheckpointer(self.directory / diskcache.core.DBNAME, log)
        self._unculled = 0  # entries written as rows since the last cull of expired rows
        self._batch_thread: int | None = None  # the thread inside `batch()`, whose writes join its transaction

    @property
    def damaged(self) -> int:
        return int(self.cache.disk.damaged)

    # ---------------------------------------------------------------- writes
    def allocate(self, n: int = 1) -> list[int]:
        last = int(self.cache.incr("next_id", n))
        return list(range(last - n + 1, last + 1))

    def put(self, entry: CacheEntry, vector: np.ndarray | None = None, ttl: float | None = None) -> int:
        return self._put(entry, vector, ttl)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        with self.cache.transact():
            outer, self._batch_thread = self._batch_thread, threading.get_ident()
            try:
                yield
            finally:
                self._batch_thread = outer

    def put_many(self, items: Sequence[tuple[CacheEntry, np.ndarray]]) -> list[int]:
        with self.cache.transact():
            return [self._put_rows(entry, vector, None) for entry, vector in items]

    def _put(self, entry: CacheEntry, vector: np.ndarray | None, ttl: float | None) -> int:
        # one transaction (a commit costs more than the writes in it); vector before entry, entry
        # before exact pointer all the same, so no reader sees a half entry
        if self._batch_thread == threading.get_ident():  # this thread's batch: already its transaction
            return self._put_rows(entry, vector, ttl)
        with self.cache.transact():
            return self._put_rows(entry, vector, ttl)

    def _put_rows(self, entry: CacheEntry, vector: np.ndarray | None, ttl: float | None) -> int:
        if vector is not None:
            vec = np.ascontiguousarray(vector, dtype=np.float32).reshape(self.dim).tobytes()
            self.cache.set(f"v:{entry.id}", seal_with(self.cipher, vec, entry.scope, f"v:{entry.id}"), expire=ttl)
        raw = entry.to_bytes()
        key = f"e:{entry.id}"
        value = seal_with(self.cipher, raw, entry.scope, key)
        rows: dict[str, int | bytes] = {}
        if len(value) + SEAL_BYTES < self.cache.disk.min_file_size:  # the usual answer: a row, as `set` writes it
            rows[key] = seal(value)
        else:  # a value file of its own: diskcache's `set` writes it (and seals it)
            self.cache.set(key, value, expire=ttl)
        # the entry, its index rows and its exact pointer in one statement, in that order, in the
        # entry's transaction: no reader sees an id listed before its entry is there
        rows.update({f"g:{term}|{entry.id}": 1 for term in index_terms(entry.tags, entry.tenant)})
        if entry.exact_key is not None:
            rows[f"x:{entry.exact_key}"] = entry.id
        put_ints(self.cache, rows, ttl)
        self._unculled += 1
        if self._unculled >= CULL_EVERY:  # the expired rows `set` would have culled as it went
            self._unculled = 0
            self.cache.expire()
        return self._size(len(raw), vector is not None)

    def rewrite(self, entry: CacheEntry) -> bool:
        remaining = None if entry.expires is None else entry.expires - time.time()
        if remaining is not None and remaining <= 0:
            return False
        with self.cache.transact():  # never resurrect an entry deleted meanwhile
            if f"e:{entry.id}" not in self.cache:
                return False
            self.cache.set(
                f"e:{entry.id}",
                seal_with(self.cipher, entry.to_bytes(), entry.scope, f"e:{entry.id}"),
                expire=remaining,
            )
        return True

    def delete(self, entry_id: int) -> bool:
        raw = self._opened(self.cache.get(f"e:{entry_id}"), f"e:{entry_id}", None)
        key = _exact_key_of(raw)
        if key is not None:
            self._unpoint(key, entry_id)
        for term in _terms_of(raw):
            self.cache.delete(f"g:{term}|{entry_id}")
        # present but damaged (reads as absent) still counts as removed, and is logged
        existed = bool(self.cache.delete(f"e:{entry_id}"))
        self.cache.delete(f"v:{entry_id}")
        if existed:
            seq = int(self.cache.incr("del_seq"))
            self.cache.set(f"d:{seq}", entry_id, expire=DELETE_LOG_TTL_S)
        return existed

    def set_marks(self, scope: str, marks: list[Mark], ttl: float | None = None) -> None:
        self.cache.set(f"t:{scope}", seal_with(self.cipher, encode_marks(marks), scope, f"t:{scope}"), expire=ttl)

    def rewrite_marks(self, scope: str, marks: list[Mark]) -> None:
        with self.cache.transact():
            held, expires = self.cache.get(f"t:{scope}", expire_time=True)
            if held is None:  # gone meanwhile: nothing to keep
                return
            if not marks or (expires is not None and expires <= time.time()):
                self.cache.delete(f"t:{scope}")
            else:
                self.cache.set(
                    f"t:{scope}",
                    seal_with(self.cipher, encode_marks(marks), scope, f"t:{scope}"),
                    expire=None if expires is None else expires - time.time(),
                )

    def scrub(self) -> bool:
        return scrub(self.directory)

    # ---------------------------------------------------------------- reads
    def get(self, entry_id: int) -> CacheEntry | None:
        found = self._read(entry_id)
        return found[0] if found is not None else None

    def load(self, entry_id: int) -> Stored | None:
        found = self._read(entry_id)
        if found is None:
            return None
        entry, raw_len = found
        vector = self._vector(entry_id, copy=False)
        return Stored(entry, vector, self._size(raw_len, vector is not None))

    def load_many(self, ids: Sequence[int]) -> list[Stored | None]:
        return [self.load(i) for i in ids]

    def vector(self, entry_id: int) -> np.ndarray | None:
        return self._vector(entry_id, copy=True)

    def get_exact(self, key: str) -> CacheEntry | None:
        entry_id = self.exact_id(key)
        if entry_id is None:
            return None
        entry = self.get(entry_id)
        if entry is not None and entry.exact_key != key:  # a damaged pointer: never another request's answer
            self.cache.disk.report(None, f"exact pointer leads to entry {entry.id} of another request")
            self._unpoint(key, entry_id)
            return None
        return entry

    def exact_id(self, key: str) -> int | None:
        return get_int(self.cache, f"x:{key}")

    def scan(self) -> Iterator[Stored]:
        for key in self.cache.iterkeys():
            if not (isinstance(key, str) and key.startswith("e:")):
                continue
            stored = self.load(int(key[2:]))
            if stored is None:
                self.cache.delete(key)  # damaged (reads as absent) or just expired: nothing to keep
                continue
            yield stored

    def marks(self, scope: str) -> list[Mark]:
        return decode_marks(self._opened(self.cache.get(f"t:{scope}"), f"t:{scope}", "marks"), self.dim)

    def tagged(self, term: str) -> list[int]:
        # "|" is in no term (kvgate.index.responses.tags) and "}" is the character after it
        return [int(k.rsplit("|", 1)[1]) for k in keys_between(self.cache, f"g:{term}|", f"g:{term}}}")]

    def mark_scopes(self) -> list[str]:
        return [k[2:] for k in keys_between(self.cache, "t:", "t;")]

    # ---------------------------------------------------------------- change log
    def log_position(self) -> tuple[int, int]:
        return int(self.cache.get("next_id", 0) or 0), int(self.cache.get("del_seq", 0) or 0)

    def read_log(self, since: tuple[int, int]) -> tuple[tuple[int, int], list[int], list[int]]:
        seen_id, seen_del = since
        last_id, last_del = self.log_position()
        added = list(range(seen_id + 1, last_id + 1))  # every id allocated since: some not written yet
        removed = []
        for seq in range(seen_del + 1, last_del + 1):
            gone = self.cache.get(f"d:{seq}")
            if gone is not None:  # None: older than DELETE_LOG_TTL_S
                removed.append(int(gone))
        return (max(seen_id, last_id), max(seen_del, last_del)), added, removed

    # ---------------------------------------------------------------- housekeeping
    def volume(self) -> int:
        return int(self.cache.volume())

    def close(self) -> None:
        self._wal.close()
        self.cache.close()

    # ---------------------------------------------------------------- internals
    def _read(self, entry_id: int) -> tuple[CacheEntry, int] | None:
        """The entry stored as e:<id> and its stored length; None if absent or damaged."""
        raw = self.cache.get(f"e:{entry_id}")
        if raw is None:
            return None
        try:
            raw = open_with(self.cipher, raw, f"e:{entry_id}", "entries")
            entry = CacheEntry.from_bytes(raw)
        except (ValueError, TypeError) as exc:  # sealed but not an entry (or not under our key): a miss, and gone
            self.cache.disk.report(None, f"key e:{entry_id} holds no entry ({exc}); deleted")
            self.delete(entry_id)
            return None
        if entry.id != entry_id:  # an intact value under the wrong key (a damaged database page)
            self.cache.disk.report(None, f"key e:{entry_id} holds entry {entry.id}")
            return None
        return entry, len(raw)

    def _unpoint(self, key: str, entry_id: int) -> None:
        """Delete pointer `key` only while it leads to `entry_id`."""
        with self.cache.transact():  # another process may be pointing the key at its new entry
            if self.cache.get(f"x:{key}") == entry_id:
                self.cache.delete(f"x:{key}")

    def _opened(self, raw: bytes | None, where: str, layer: str | None) -> bytes | None:
        """`raw` as read from `where`, opened; None when absent or when it does not authenticate
        (counted under `layer` by the cipher; None: a second look at a value already counted)."""
        try:
            return None if raw is None else open_with(self.cipher, raw, where, layer)
        except ValueError:
            return None

    def _vector(self, entry_id: int, copy: bool) -> np.ndarray | None:
        raw = self._opened(self.cache.get(f"v:{entry_id}"), f"v:{entry_id}", "vectors")
        if raw is None or len(raw) != 4 * self.dim:
            return None
        vector = np.frombuffer(raw, dtype=np.float32)
        return vector.copy() if copy else vector

    def _size(self, entry_bytes: int, has_vector: bool) -> int:
        """What an entry holds: its JSON plus its float32 vector (the byte budget's unit)."""
        return entry_bytes + (4 * self.dim if has_vector else 0)
