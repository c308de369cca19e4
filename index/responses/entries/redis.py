"""RedisEntryStore: the response cache's entries in a shared Redis, for proxies on several machines.

Layout under the key prefix P (values sealed: kvgate.index.storage.sealed, magic + SHA-256, so damage reads as
absent and is deleted; with a cipher, the j and v fields and the marks are first encrypted under
their scope's key, kvgate.index.storage.cipher, and what fails authentication is damage too):
  P e:<id>    hash {j: entry JSON, v: float32 vector bytes (absent: exact-only), k: exact key,
              g: its index terms, newline separated}
  P x:<key>   exact request hash → id (the key is a digest of route, model, messages, params and,
              for tenant-scoped routes, the tenant)
  P t:<scope> tightening marks (kvgate.index.responses.tighten) of a scope (a digest that holds the tenant too)
  P g:<term>  sorted set of the ids filed under an index term (a tag or a tenant's term,
              kvgate.index.responses.tags), scored by their expiry (ms; +inf: none); an entry lists
              its terms in its hash's field g; the put script adds it (and drops members expired
              by then, so a busy term's set holds its live entries only), the delete script
              removes it, and the set expires no sooner than its longest-lived entry. Redis may
              evict a set under `maxmemory` before its entries, so a tenant's erasure also scans
              every entry, and an invalidation can be asked to (`sweep`)
  P id        the id counter; started at milliseconds-since-epoch × 1000 when absent, so ids
              from before an empty restart are never handed out again (never a wrong answer
              from a stale local vector)
  P log       the change log: a Stream of {op: a|d, id, n}, XADD MAXLEN ~ `log_max`
  P seq, P epoch   the log's sequence counter and a random token set when the log starts
Tenants: every lookup reaches an entry through a tenant-holding digest (exact key, scope), and
SemanticIndex serves an entry only when its recorded scope is the one searched.

Each write is one Lua script (atomic: vector, entry and pointer together, then the log entry;
kvgate.index.responses.entries.redis_scripts); expiry is Redis's (PEXPIRE), eviction under memory pressure is Redis's (`maxmemory` +
`allkeys-lru`). The log cursor is (epoch, stream id, n): a reader whose next entry is not n+1, or
whose epoch is gone (Redis restarted empty, or flushed), gets LogGap and rebuilds from `scan`.
All commands go through kvgate.index.storage.redis_link (StoreDown while Redis is out of reach, with backoff).
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import redis

from kvgate.index.responses.entries.base import CacheEntry, LogGap, Stored
from kvgate.index.responses.entries.redis_scripts import ALLOCATE, DELETE, EXACT, POSITION, PUT, READ, REWRITE, UNPOINT
from kvgate.index.responses.tags import index_terms
from kvgate.index.responses.tighten import Mark, decode_marks, encode_marks
from kvgate.index.storage.cipher import EntryCipher, open_with, seal_with
from kvgate.index.storage.redis_link import RedisLink
from kvgate.index.storage.sealed import Damaged, seal, unseal

LOG_MAX = 1_000_000  # stream entries kept (approximately: MAXLEN ~)
READ_BATCH = 1_000  # stream entries / entries read per round trip

Cursor = tuple[bytes, bytes, int]  # (epoch, last stream id read, its sequence number)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisEntryStore:
    """EntryStore on Redis; one handle per process, any number of processes and machines."""

    def __init__(
        self,
        link: RedisLink,
        dim: int,
        key_prefix: str = "kvgate:",
        log_max: int = LOG_MAX,
        cipher: EntryCipher | None = None,
    ) -> None:
        self.link = link
        self.cipher = cipher  # entries, vectors and marks encrypted under their scope's key, inside the seal
        self.dim = dim
        self.where = f"{link.where} (prefix {key_prefix!r})"
        self.failures: tuple[type[BaseException], ...] = (redis.exceptions.RedisError,)
        self.log_max = log_max
        p = key_prefix
        self._e, self._x, self._t, self._g = f"{p}e:", f"{p}x:", f"{p}t:", f"{p}g:"
        self._id, self._log, self._seq, self._epoch = f"{p}id", f"{p}log", f"{p}seq", f"{p}epoch"
        r = link.client
        self._put_script, self._delete_script = r.register_script(PUT), r.register_script(DELETE)
        self._rewrite_script, self._unpoint_script = r.register_script(REWRITE), r.register_script(UNPOINT)
        self._exact_script, self._allocate_script = r.register_script(EXACT), r.register_script(ALLOCATE)
        self._position_script, self._read_script = r.register_script(POSITION), r.register_script(READ)
        self._damaged = 0
        self._lock = threading.Lock()

    @property
    def damaged(self) -> int:
        return self._damaged

    # ---------------------------------------------------------------- writes
    def allocate(self, n: int = 1) -> list[int]:
        base = int(time.time() * 1000) * 1000
        last = int(self.link.run("allocate", lambda r: self._allocate_script(keys=[self._id], args=[base, n])))
        return list(range(last - n + 1, last + 1))

    def put(self, entry: CacheEntry, vector: np.ndarray | None = None, ttl: float | None = None) -> int:
        args, size = self._put_args(entry, vector, ttl)
        self.link.run("store", lambda r: self._put_script(keys=self._put_keys(entry), args=args))
        return size

    def batch(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()  # each put is one script call already

    def put_many(self, items: Sequence[tuple[CacheEntry, np.ndarray]]) -> list[int]:
        sizes: list[int] = []

        def write(r: redis.Redis) -> None:
            pipe = r.pipeline(transaction=True)
            for entry, vector in items:
                args, size = self._put_args(entry, vector, None)
                self._put_script(keys=self._put_keys(entry), args=args, client=pipe)
                sizes.append(size)
            pipe.execute()

        self.link.run("store", write)
        return sizes

    def rewrite(self, entry: CacheEntry) -> bool:
        if entry.expires is not None and entry.expires <= time.time():
            return False
        raw = seal(seal_with(self.cipher, entry.to_bytes(), entry.scope, f"e:{entry.id}"))
        return bool(self.link.run("store", lambda r: self._rewrite_script(keys=[self._e + str(entry.id)], args=[raw])))

    def delete(self, entry_id: int) -> bool:
        keys, args = [self._e + str(entry_id), self._seq, self._log], [entry_id, self._x, self._g, self.log_max]
        return bool(self.link.run("delete", lambda r: self._delete_script(keys=keys, args=args)))

    def set_marks(self, scope: str, marks: list[Mark], ttl: float | None = None) -> None:
        px = max(1, int(ttl * 1000)) if ttl else None
        raw = seal_with(self.cipher, encode_marks(marks), scope, f"t:{scope}")
        self.link.run("store", lambda r: r.set(self._t + scope, raw, px=px))

    # ---------------------------------------------------------------- reads
    def get(self, entry_id: int) -> CacheEntry | None:
        raw = self.link.run("lookup", lambda r: r.hget(self._e + str(entry_id), "j"))
        found = self._entry(entry_id, raw)
        return found[0] if found is not None else None

    def load(self, entry_id: int) -> Stored | None:
        return self.load_many([entry_id])[0]

    def load_many(self, ids: Sequence[int]) -> list[Stored | None]:
        out: list[Stored | None] = []
        for start in range(0, len(ids), READ_BATCH):
            batch = ids[start : start + READ_BATCH]

            def read(r: redis.Redis, batch: Sequence[int] = batch) -> list[Any]:
                pipe = r.pipeline(transaction=False)
                for i in batch:
                    pipe.hmget(self._e + str(i), "j", "v")
                return pipe.execute()

            for entry_id, (raw, vec) in zip(batch, self.link.run("lookup", read)):
                out.append(self._stored(entry_id, raw, vec))
        return out

    def vector(self, entry_id: int) -> np.ndarray | None:
        raw = self.link.run("lookup", lambda r: r.hget(self._e + str(entry_id), "v"))
        vec = self._vector(entry_id, raw)
        return None if vec is None else vec.copy()

    def get_exact(self, key: str) -> CacheEntry | None:
        found = self.link.run("lookup", lambda r: self._exact_script(keys=[self._x + key], args=[self._e]))
        if not found:
            return None
        entry_id = int(found[0])
        got = self._entry(entry_id, found[1] or None)
        if got is None:
            return None
        entry = got[0]
        if entry.exact_key != key:  # a damaged pointer: never another request's answer
            self._count_damage()
            self.link.run("delete", lambda r: self._unpoint_script(keys=[self._x + key], args=[entry_id]))
            return None
        return entry

    def exact_id(self, key: str) -> int | None:
        raw = self.link.run("lookup", lambda r: r.get(self._x + key))
        return None if raw is None else int(raw)

    def scan(self) -> Iterator[Stored]:
        cursor = 0
        while True:
            cursor, keys = self.link.run("scan", lambda r, c=cursor: r.scan(c, match=self._e + "*", count=READ_BATCH))
            ids = [int(_text(k)[len(self._e) :]) for k in keys]
            for stored in self.load_many(ids):
                if stored is not None:
                    yield stored
            if int(cursor) == 0:
                return

    def marks(self, scope: str) -> list[Mark]:
        raw = self.link.run("lookup", lambda r: r.get(self._t + scope))
        try:
            return decode_marks(None if raw is None else open_with(self.cipher, raw, f"t:{scope}", "marks"), self.dim)
        except ValueError:  # does not open (tampered, another key): as if there were none
            return []

    def tagged(self, term: str) -> list[int]:
        members = self.link.run("scan", lambda r: r.zrangebyscore(self._g + term, "-inf", "+inf"))
        return sorted(int(m) for m in members)

    def mark_scopes(self) -> list[str]:
        keys = self.link.run("scan", lambda r: list(r.scan_iter(match=self._t + "*", count=READ_BATCH)))
        return [_text(k)[len(self._t) :] for k in keys]

    def rewrite_marks(self, scope: str, marks: list[Mark]) -> None:
        if marks:  # XX: never recreate marks that expired meanwhile; KEEPTTL: their expiry stays
            raw = seal_with(self.cipher, encode_marks(marks), scope, f"t:{scope}")
            self.link.run("store", lambda r: r.set(self._t + scope, raw, xx=True, keepttl=True))
        else:
            self.link.run("delete", lambda r: r.unlink(self._t + scope))

    def scrub(self) -> bool:
        return True  # a deleted key's bytes are Redis's freed memory: no command reads them

    # ---------------------------------------------------------------- change log
    def log_position(self) -> Cursor:
        token = secrets.token_hex(8)
        epoch, last, n = self.link.run(
            "log", lambda r: self._position_script(keys=[self._epoch, self._log], args=[token])
        )
        return bytes(epoch or b""), bytes(last), int(n)  # no epoch (evicted meanwhile): the next read is a gap

    def read_log(self, since: Cursor) -> tuple[Cursor, list[int], list[int]]:
        epoch, after, seq = since
        added: list[int] = []
        removed: list[int] = []
        while True:
            now, rows = self.link.run(
                "log", lambda r, a=after: self._read_script(keys=[self._epoch, self._log], args=[a, READ_BATCH])
            )
            if now != epoch:  # restarted empty or flushed: nothing logged before still holds
                raise LogGap(f"the change log of {self.where} was reset")
            for stream_id, fields in rows:
                f = {
                    _text(k): _text(v)
                    for k, v in (fields.items() if isinstance(fields, dict) else zip(fields[::2], fields[1::2]))
                }
                n = int(f["n"])
                if n != seq + 1:  # entries between were trimmed (MAXLEN) or lost: this reader cannot follow
                    raise LogGap(f"the change log of {self.where} lost entries {seq + 1}..{n - 1}")
                (added if f["op"] == "a" else removed).append(int(f["id"]))
                after, seq = bytes(stream_id), n
            if len(rows) < READ_BATCH:
                return (epoch, after, seq), added, removed

    # ---------------------------------------------------------------- housekeeping
    def volume(self) -> int:
        return int(self.link.run("stats", lambda r: r.info("memory"))["used_memory"])

    def close(self) -> None:
        self.link.close()

    # ---------------------------------------------------------------- internals
    def _put_keys(self, entry: CacheEntry) -> list[str]:
        pointer = self._x + entry.exact_key if entry.exact_key is not None else self._x
        return [self._e + str(entry.id), pointer, self._seq, self._log]

    def _put_args(self, entry: CacheEntry, vector: np.ndarray | None, ttl: float | None) -> tuple[list[Any], int]:
        raw = entry.to_bytes()
        vec = (
            b""
            if vector is None
            else seal(
                seal_with(
                    self.cipher,
                    np.ascontiguousarray(vector, dtype=np.float32).reshape(self.dim).tobytes(),
                    entry.scope,
                    f"v:{entry.id}",
                )
            )
        )
        px = max(1, int(ttl * 1000)) if ttl else 0
        terms = "\n".join(index_terms(entry.tags, entry.tenant))
        args = [
            entry.id,
            seal(seal_with(self.cipher, raw, entry.scope, f"e:{entry.id}")),
            vec,
            entry.exact_key or "",
            px,
            terms,
            self._g,
            self.log_max,
        ]
        return args, len(raw) + (4 * self.dim if vector is not None else 0)

    def _entry(self, entry_id: int, raw: bytes | None) -> tuple[CacheEntry, int] | None:
        """The entry sealed in `raw` and its JSON length; None if absent; damage is counted,
        deleted, and None."""
        if raw is None:
            return None
        try:
            payload = open_with(self.cipher, unseal(raw), f"e:{entry_id}", "entries")
            entry = CacheEntry.from_bytes(payload)
        except (Damaged, ValueError, TypeError):
            entry, payload = None, b""
        if entry is None or entry.id != entry_id:
            self._count_damage()
            self.delete(entry_id)
            return None
        return entry, len(payload)

    def _stored(self, entry_id: int, raw: bytes | None, vec: bytes | None) -> Stored | None:
        found = self._entry(entry_id, raw)
        if found is None:
            return None
        vector = self._vector(entry_id, vec)
        return Stored(found[0], vector, found[1] + (4 * self.dim if vector is not None else 0))

    def _vector(self, entry_id: int, raw: bytes | None) -> np.ndarray | None:
        if raw is None:
            return None
        try:
            payload = open_with(self.cipher, unseal(raw), f"v:{entry_id}", "vectors")
        except ValueError:  # Damaged, or not under our key
            self._count_damage()
            return None
        return np.frombuffer(payload, dtype=np.float32) if len(payload) == 4 * self.dim else None

    def _count_damage(self) -> None:
        with self._lock:
            self._damaged += 1
