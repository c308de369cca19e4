"""The EntryStore protocol: where the response cache's answers live, one implementation per file.

An entry store is the shared truth of the response cache: every process (proxy worker, proxy
replica) that opens the same store sees the same entries. It holds, per entry id:
  - the entry (CacheEntry: scope, exact key, question text, stored answer, expiry, floor);
  - its question vector (float32[dim], unit length), absent for exact-only entries;
  - an exact pointer `exact_key → id` when the entry has an exact key;
and per scope the tightening marks of wrong-hit feedback (kvgate.index.responses.tighten). It also keeps a change
log (ids added, ids deleted) that other processes follow to keep their local vectors current.

It does *not* search vectors (kvgate.index.responses.vectors, per process), order entries for eviction or hold
budgets (kvgate.index.responses.eviction), or decide when to look at the log (kvgate.index.responses.follow): SemanticIndex composes
those. A backend may still drop entries on its own (TTL expiry, Redis `maxmemory`): callers treat
an entry that vanished as a miss, never as an error.

Rules every implementation keeps (tests/test_entry_store.py checks them for each one):
  - a vanished entry is a miss: reads of a deleted, expired, evicted or damaged entry return None;
  - never a wrong answer: `get(i)` returns an entry whose id is i, `get_exact(k)` one whose
    exact_key is k, or None (damage is counted in `damaged`, never served);
  - writes are ordered so that a reader in another process never sees half an entry: the vector
    before the entry, the entry before its exact pointer;
  - deletes are logged (`read_log`) and never remove another entry's pointer;
  - an entry is filed under its index terms (tags and tenant: kvgate.index.responses.tags) from its
    put until its delete or expiry, so `tagged(term)` lists it; a listed id may have vanished;
  - failures of the storage itself (full, damaged, unreachable, timed out) raise one of
    `failures`; SemanticIndex turns those into misses and skipped writes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import orjson

from kvgate.index.responses.tighten import Mark

# A position in a store's change log, opaque to callers: (next id, delete sequence) for the disk
# store, (epoch token, stream id, sequence number) for Redis. Only the store that returned it reads it.
Cursor = Any


@dataclass
class CacheEntry:
    """One stored answer and what it answers."""

    id: int
    scope: str
    response: dict[str, Any]
    exact_key: str | None = None
    text: str = ""
    route: str = ""
    model: str = ""
    created: float = field(default_factory=time.time)
    expires: float | None = None
    min_similarity: float | None = None  # per-entry floor raised by wrong-hit feedback (kvgate.index.responses.tighten)
    parents: list[str] | None = None  # context: semantic: the earlier user turns this answer followed
    tenant: str | None = None  # whose request made it (erasing a tenant removes it, whatever the route's scope)
    tags: list[str] | None = (
        None  # what the answer depends on (kvgate.index.responses.tags): invalidation finds it by them
    )

    def to_bytes(self) -> bytes:
        """Compact JSON (no pickle): the stored form of the entry. orjson writes it; what orjson
        refuses (an integer past 64 bits, a key that is not a string) json writes as before."""
        try:
            return orjson.dumps(self.__dict__)
        except TypeError:  # orjson.JSONEncodeError is one
            return json.dumps(self.__dict__, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> CacheEntry:
        """Inverse of to_bytes; raises ValueError or TypeError for anything else."""
        return cls(**json.loads(raw))


@dataclass(frozen=True)
class Stored:
    """An entry as a reader loads it to index it: with its vector and the bytes it holds."""

    entry: CacheEntry
    vector: np.ndarray | None  # float32[dim]; None for exact-only entries (or a damaged vector)
    size: int  # bytes the entry holds in the store: what the byte budget counts


class LogGap(Exception):
    """`read_log` cannot say what changed since the cursor (the log was trimmed past it, or the
    store restarted empty): the reader drops its local view and rebuilds it from `scan`, then
    follows from a fresh `log_position`."""


@runtime_checkable
class ChangeLog(Protocol):
    """What other processes sharing a store added and deleted (followed by kvgate.index.responses.follow)."""

    def log_position(self) -> Cursor:
        """The log's current end: following from here reports only later changes."""
        ...

    def read_log(self, since: Cursor) -> tuple[Cursor, list[int], list[int]]:
        """(new cursor, added ids, deleted ids) since `since`, oldest first.

        `added` may list an id whose entry is not readable yet (a writer between `allocate` and
        `put`) or any more (deleted since): the follower retries unreadable ids for a while, then
        gives them up. It includes this process's own ids (the follower skips them). `deleted`
        lists every id `delete` removed since `since`, by any process, this one included; a log
        may forget deletions older than its retention (the disk store keeps them an hour).
        Reading never changes what another reader sees. Raises LogGap when the log no longer
        reaches back to `since` and the store can tell (the Redis store can: sequence numbers
        and an epoch token)."""
        ...


@runtime_checkable
class EntryStore(ChangeLog, Protocol):
    """Entries, vectors, exact pointers, marks and the change log of one response cache.

    Implementations are thread-safe and safe to share between processes (each process opens its
    own handle on the same directory, database or key prefix). Methods raise only `failures`
    for storage trouble; anything else is a bug and propagates.
    """

    dim: int  # vector dimension; vectors of another length read as absent
    where: str  # where the entries live, for logs: a directory, a Redis URL without credentials
    failures: tuple[type[BaseException], ...]  # what storage trouble raises (disk full, timeout...)

    def allocate(self, n: int = 1) -> list[int]:
        """n fresh ids, unique across every handle on the store and across restarts (one atomic
        counter increment: INCRBY on Redis). An allocated id need never be stored."""
        ...

    def put(self, entry: CacheEntry, vector: np.ndarray | None = None, ttl: float | None = None) -> int:
        """Store `entry` under `entry.id`, with its question `vector` when given, and, when
        `entry.exact_key` is set, point that key at it (an earlier entry under the same key
        stays until deleted: the caller deletes it). Everything written expires after `ttl`
        seconds (None: never), by the backend's own expiry, so an expired entry is never read.

        Visible in order vector, entry, pointer (a MULTI/EXEC or an ordered pipeline on Redis);
        once it returns, `read_log` lists the id as added (XADD after the write on Redis; the
        disk store lists every allocated id). Returns the bytes the entry holds, the same figure
        `load` reports for it later."""
        ...

    def batch(self) -> AbstractContextManager[Any]:
        """Writes made inside (puts, deletes) commit together at its end where the store has
        transactions; the caller counts a failure to begin or commit (`failures`)."""
        ...

    def put_many(self, items: Sequence[tuple[CacheEntry, np.ndarray]]) -> list[int]:
        """`put` of each (entry, vector) with no TTL, in one transaction where the backend has
        them (bulk warm-up, benchmarks). Returns each entry's size."""
        ...

    def get(self, entry_id: int) -> CacheEntry | None:
        """The live entry with this id, or None: never stored, deleted, expired, evicted by the
        backend, or damaged (counted in `damaged`; an unreadable entry is deleted)."""
        ...

    def load(self, entry_id: int) -> Stored | None:
        """As `get`, with the entry's vector and size: what a follower needs to index it."""
        ...

    def load_many(self, ids: Sequence[int]) -> list[Stored | None]:
        """`load` of each id, in order (pipelined where the backend can: catching up on a log)."""
        ...

    def vector(self, entry_id: int) -> np.ndarray | None:
        """A copy of the entry's question vector; None for exact-only, gone or damaged entries."""
        ...

    def get_exact(self, key: str) -> CacheEntry | None:
        """The live entry the exact pointer `key` leads to, or None. A pointer whose entry
        vanished is a miss; a pointer leading to an entry with another exact key is damage:
        counted, the pointer deleted (only if it still leads there), None returned."""
        ...

    def exact_id(self, key: str) -> int | None:
        """The id `key` points at, without reading the entry (to delete what a new answer
        replaces); may name an entry that has vanished."""
        ...

    def rewrite(self, entry: CacheEntry) -> bool:
        """Replace the stored record of `entry.id` (a raised floor) keeping its vector, pointer
        and expiry (`entry.expires`). Atomic check-and-set: False, and nothing written, when the
        entry is gone or expired, so a rewrite never resurrects a deleted entry (WATCH or a Lua
        script on Redis)."""
        ...

    def delete(self, entry_id: int) -> bool:
        """Remove the entry, its vector, and its exact pointer if that pointer still leads to
        this id (another process may have pointed the key at a newer entry: that pointer stays;
        the compare-and-delete is atomic). Logs the id as deleted when something was removed.
        Returns whether the entry was stored; deleting twice is harmless."""
        ...

    def scan(self) -> Iterator[Stored]:
        """Every live entry, in no promised order, to rebuild vectors and LRU on open. Entries
        that cannot be read are skipped (and deleted where the store can tell)."""
        ...

    def marks(self, scope: str) -> list[Mark]:
        """The tightening marks of `scope`, oldest first ([] when none)."""
        ...

    def set_marks(self, scope: str, marks: list[Mark], ttl: float | None = None) -> None:
        """Replace the marks of `scope` (last writer wins: two processes tightening the same
        scope at once may lose one mark; the floors they raised stay)."""
        ...

    def tagged(self, term: str) -> list[int]:
        """The ids filed under index term `term` (a tag, or a tenant's term), without reading
        the entries: what invalidation and erasure delete (each id is read before it counts)."""
        ...

    def mark_scopes(self) -> list[str]:
        """Every scope that has tightening marks (erasing a tenant drops its marks)."""
        ...

    def rewrite_marks(self, scope: str, marks: list[Mark]) -> None:
        """Replace the marks of `scope` keeping their expiry; [] deletes them."""
        ...

    def scrub(self) -> bool:
        """After deletions that must leave nothing behind (a tenant's erasure): make what was
        deleted unreadable in the store's own files too (the disk store zeroes deleted content as
        it goes and here truncates its write-ahead log, which still holds old pages). False when
        that could not finish now (busy); the deletions themselves stand."""
        ...

    @property
    def damaged(self) -> int:
        """Damaged items met since open (failed checksums, unreadable entries, pointers or ids
        that disagree); an in-memory count, cheap to read after every miss."""
        ...

    def volume(self) -> int:
        """Bytes the store occupies (for stats); raises one of `failures` when it cannot say."""
        ...

    def close(self) -> None:
        """Release the handle; the store is not used afterwards through it."""
        ...
