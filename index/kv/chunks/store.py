"""ChunkStore: KV chunks of long prompts, keyed by the prefix hash chain, over storage tiers.

A chunk is the KV cache of `chunk_tokens` consecutive prompt tokens (all layers). It is keyed by
the chained hash of its block (`chunk_hashes`), which covers every token before the chunk's end,
so chunk i is only ever reused after exactly the same i·chunk_tokens-token prefix, and a prompt's
reusable KV is the longest run of *leading* chunks present. Keys are
"kv:<namespace>:<hash as 16 hex digits>"; the namespace (model and dtype, e.g.
"smollm2-135m:float32") keeps different models' KV apart in shared tiers.

Tiers are ordered fastest first (e.g. memory, disk, remote). Writes go to every tier
(write-through); a read takes the first tier that has the key and copies it into the faster tiers
(promotion: a chunk another replica left in the remote tier lands in this replica's RAM at once
and on its disk in the background, kvgate.index.kv.chunks.promoter).
A BatchTier (kvgate.index.kv.chunks.base) gets a prompt's chunks in one call each way.
Every read is verified by the codec (checksum + key); a chunk that fails is counted, logged,
deleted from every tier and treated as a miss, so the caller recomputes it: wrong KV is never
returned. With a `cipher`, what the tiers outside this process hold is sealed under the key of
the request's `salt` (kvgate.index.kv.chunks.sealing); a chunk that fails authentication is
dropped and missed the same way, and counted in `auth_failures`. `longest_prefix` only asks `contains`, so it is a cheap upper bound that `get_many`
can undercut (eviction by another process, a damaged chunk); callers use what `get_many` returns.

Removal. `watch_removed(callback)` hears of chunks that NO tier holds any more: when a tier's
own eviction drops a key (tiers with `watch_evictions`), the store checks the other tiers, and
reports the hash only if none still has it; a damaged chunk dropped everywhere is reported too.
A chunk evicted from RAM but still on disk is still loadable without a prefill, so it is not
removed; one still in the remote tier only is reported to `watch_demoted` instead. Not
reported: `clear()` (its caller knows) and evictions by another process sharing a
tier (that process's store hears of them, not this one).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence

from kvgate.index.kv.chunks.base import BatchTier, StorageTier
from kvgate.index.kv.chunks.codec import CorruptChunk, KVChunk
from kvgate.index.kv.chunks.promoter import Promoter
from kvgate.index.kv.chunks.sealing import TierSealing
from kvgate.index.kv.chunks.store_codec import ChunkCodec, PairCodec
from kvgate.index.kv.hashing import BlockHash, block_hashes
from kvgate.index.storage.cipher import ChunkCipher

log = logging.getLogger("kvgate.chunks")


def chunk_hashes(tokens: Sequence[int], chunk_tokens: int = 256, namespace: Sequence[str | int] = ()) -> list[int]:
    """Chained hashes of every full `chunk_tokens` block of `tokens` (a partial tail is not hashed:
    only full chunks are stored). `namespace` goes into every hash as extra keys."""
    return block_hashes(tokens, chunk_tokens, extra=namespace)


class ChunkStore:
    """KV chunks by chained hash over `tiers` (fastest first). Thread-safe if the tiers are.

    Invariant: `get_many` returns only chunks that decoded under their own key with a valid
    checksum, and they are exactly the first len(result) chunks asked for.
    """

    def __init__(
        self,
        tiers: list[StorageTier],
        namespace: str,
        codec: ChunkCodec | None = None,
        cipher: ChunkCipher | None = None,
    ) -> None:
        """`codec`: how chunks become bytes and back (default: the (keys, values) pair codec of
        codec.py; the vLLM connector passes a LayerCodec). `cipher`: see the module docstring."""
        if not tiers:
            raise ValueError("a ChunkStore needs at least one tier")
        names = [t.name for t in tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        if not namespace:
            raise ValueError("namespace must be non-empty (e.g. 'model:dtype')")
        self.tiers = list(tiers)
        self._batch = {t.name for t in tiers if isinstance(t, BatchTier)}  # asked one round trip per prompt
        self.namespace = namespace
        self.codec: ChunkCodec = codec or PairCodec()
        self._sealing = TierSealing(self.tiers, cipher)
        self._prefix = f"kv:{namespace}:"
        self._lock = threading.Lock()  # guards the counters below
        self._queries = {name: 0 for name in names}  # reads asked of the tier (after the faster ones missed)
        self._hits = {name: 0 for name in names}  # reads the tier served, verified
        self._writes = {name: 0 for name in names}  # chunks written to the tier (put_many and promotions)
        self._corrupt_by_tier = {name: 0 for name in names}  # reads that failed verification, by tier
        self._misses = 0
        self._corrupt = 0
        self._promotions = 0
        self._puts = 0  # successful tier writes
        self._new = 0  # chunks that were in no tier before put_many stored them
        self._put_failures = 0  # tier writes refused (too big, disk full)
        self._bytes_read = 0
        self._bytes_written = 0
        self._removed = 0  # chunks no tier holds any more after an eviction or a corrupt read
        self._watchers: list[Callable[[list[BlockHash]], None]] = []
        self._demoted_watchers: list[Callable[[list[BlockHash]], None]] = []
        self._promoter = Promoter()  # copies of remote hits into the disk tier, off the request path
        for t in self.tiers:
            watch = getattr(t, "watch_evictions", None)
            if watch is not None:
                watch(self._tier_evicted)

    def watch_removed(self, callback: Callable[[list[BlockHash]], None]) -> None:
        """Call `callback(hashes)` with this namespace's chunks that no tier holds any more (see
        the module docstring), in the thread whose put or read caused it. A callback must not
        raise and must not write to this store."""
        self._watchers.append(callback)

    def watch_demoted(self, callback: Callable[[list[BlockHash]], None]) -> None:
        """Call `callback(hashes)` with this namespace's chunks that a local tier's eviction left
        in no local tier but a BatchTier (the remote tier) still holds: loadable, from afar."""
        self._demoted_watchers.append(callback)

    def _tier_evicted(self, keys: list[str]) -> None:
        """A tier evicted `keys`: report the ones of our namespace that no tier still holds."""
        prefix = self._prefix
        mine = [k for k in keys if k.startswith(prefix)]
        held = {t.name: t.contains_many(mine) for t in self.tiers if t.name in self._batch} if mine else {}
        gone: list[BlockHash] = []
        demoted: list[BlockHash] = []
        for j, key in enumerate(mine):
            if any(t.contains(key) for t in self.tiers if t.name not in held):
                continue
            try:
                h = int(key[len(prefix) :], 16)
            except ValueError:
                continue
            (demoted if any(answers[j] for answers in held.values()) else gone).append(h)
        self._report_removed(gone)
        if demoted:
            for watch in self._demoted_watchers:
                try:
                    watch(demoted)
                except Exception:  # a broken listener must not fail a put or a read
                    log.exception("chunk demotion callback failed")

    def _report_removed(self, hashes: list[BlockHash]) -> None:
        if not hashes:
            return
        with self._lock:
            self._removed += len(hashes)
        for watch in self._watchers:
            try:
                watch(hashes)
            except Exception:  # a broken listener must not fail a put or a read
                log.exception("chunk removal callback failed")

    def key(self, h: BlockHash) -> str:
        """The tier key of chunk hash `h` in this namespace."""
        return f"{self._prefix}{h:016x}"

    def longest_prefix(self, hashes: Sequence[BlockHash], holders: list[str] | None = None) -> int:
        """Number of leading chunks present in any tier (no reads, no LRU effect). A BatchTier is
        asked at most once, for every key from the first one the faster tiers lack. `holders`, when
        given, gets the name of the fastest tier holding each counted chunk."""
        keys = [self.key(h) for h in hashes]
        asked: dict[str, tuple[int, list[bool]]] = {}  # batch tier → (first index asked, answers)

        def has(t: StorageTier, i: int) -> bool:
            if t.name not in self._batch:
                return t.contains(keys[i])
            if t.name not in asked:
                asked[t.name] = (i, t.contains_many(keys[i:]))  # type: ignore[attr-defined]
            first, answers = asked[t.name]
            return answers[i - first]

        for i in range(len(keys)):
            holder = next((t.name for t in self.tiers if has(t, i)), None)
            if holder is None:
                return i
            if holders is not None:
                holders.append(holder)
        return len(keys)

    def get_many(
        self, hashes: Sequence[BlockHash], served: list[str] | None = None, salt: str | None = None
    ) -> list[KVChunk]:
        """The longest run of leading chunks that load and verify; stops at the first missing or
        corrupt one. A hit in a slower tier is copied into the faster ones. A BatchTier serves
        each run of keys that the faster tiers lack with one call. `served`, when given, gets the
        name of the tier that served each returned chunk. `salt`: the cache_salt the chunks were
        stored with (their key with a cipher)."""
        keys = [self.key(h) for h in hashes]
        fetched: dict[str, dict[str, bytes]] = {}  # batch tier → values read ahead
        asked: dict[str, set[str]] = {}  # batch tier → keys already asked (found or not)

        def read(ti: int, i: int) -> bytes | None:
            t = self.tiers[ti]
            # a BatchTier's one round trip, or a tier that reads many keys at once (DiskTier)
            many = getattr(t, "get_many" if t.name in self._batch else "read_many", None)
            if many is None:
                return t.get(keys[i])
            ahead, tried = fetched.setdefault(t.name, {}), asked.setdefault(t.name, set())
            if keys[i] not in tried:
                j = i + 1  # the run ends where a faster tier has the key (it will serve it)
                while j < len(keys) and not any(f.contains(keys[j]) for f in self.tiers[:ti]):
                    j += 1
                ahead.update(zip(keys[i:j], many(keys[i:j])))
                tried.update(keys[i:j])
            if keys[i] in ahead or t.name in self._batch:
                return ahead.pop(keys[i], None)
            return t.get(keys[i])  # where a read-ahead stopped: asked alone, so damage is reported

        out: list[KVChunk] = []
        for i, key in enumerate(keys):
            chunk = self._load(key, lambda ti: read(ti, i), served, salt)
            if chunk is None:
                break
            out.append(chunk)
        return out

    def _load(
        self, key: str, read: Callable[[int], bytes | None], served: list[str] | None = None, salt: str | None = None
    ) -> KVChunk | None:
        for i, tier in enumerate(self.tiers):
            with self._lock:
                self._queries[tier.name] += 1
            try:
                data = read(i)
                if data is None:
                    continue
                plain = self._sealing.open(tier.name, data, key, salt)
                chunk = self.codec.decode(plain, key, verify=not getattr(tier, "in_process", False))
            except CorruptChunk as e:
                self._drop_corrupt(key, tier.name, e)
                return None
            sealed = None if plain is data else data  # data still sealed: valid as it is in every sealed tier

            def as_stored(t: StorageTier) -> bytes:
                return self._sealing.stored_as(t.name, key, plain, sealed, salt)

            # the fastest tier at once; from a BatchTier hit, the local tiers between in the background
            now = self.tiers[: i if tier.name not in self._batch else min(i, 1)]
            promoted = [faster.name for faster in now if faster.put(key, as_stored(faster))]
            for later in self.tiers[len(now) : i]:
                self._promoter.submit(lambda t=later, b=as_stored(later): self._promote(t, key, b))
            with self._lock:
                self._hits[tier.name] += 1
                self._bytes_read += len(data)
                self._promotions += bool(promoted)
                for name in promoted:
                    self._writes[name] += 1
            if served is not None:
                served.append(tier.name)
            return chunk
        with self._lock:
            self._misses += 1
        return None

    @property
    def auth_failures(self) -> int:
        """Reads whose seal did not authenticate (tampered, another master key or salt, unsealed)."""
        return self._sealing.auth_failures

    def _promote(self, tier: StorageTier, key: str, data: bytes) -> None:
        """A background copy of a loaded chunk into a slower local tier (the Promoter's thread)."""
        if tier.put(key, data):
            with self._lock:
                self._writes[tier.name] += 1

    def hold_background(self, held: bool) -> None:
        """Hold (or let go) the background promotions while the owner is busy (see Promoter.hold)."""
        self._promoter.hold(held)

    def drain(self) -> None:
        """Wait until the background promotions queued so far are written."""
        self._promoter.drain()

    def _drop_corrupt(self, key: str, tier: str, error: CorruptChunk) -> None:
        # Every copy goes, not only the bad one: the caller recomputes the chunk and put_many
        # then rewrites all tiers from fresh data.
        log.warning("dropping corrupt KV chunk from all tiers (found in %s): %s", tier, error)
        for t in self.tiers:
            t.delete(key)
        with self._lock:
            self._corrupt += 1
            self._corrupt_by_tier[tier] += 1
            self._misses += 1
        try:
            self._report_removed([int(key[len(self._prefix) :], 16)])
        except ValueError:
            pass

    def put_many(self, hashes: Sequence[BlockHash], chunks: Sequence[KVChunk], salt: str | None = None) -> int:
        """Store chunk i under hashes[i] in every tier that lacks it (encoding, and sealing with
        `salt`'s key, at most once per chunk; a BatchTier gets one contains_many and one put_many for all of them). Returns how
        many chunks were in no tier before and are now in at least one. A tier that cannot store
        (too big, disk full, Redis down) is skipped, never an exception."""
        if len(hashes) != len(chunks):
            raise ValueError(f"{len(hashes)} hashes for {len(chunks)} chunks")
        keys = [self.key(h) for h in hashes]
        present = {t.name: t.contains_many(keys) for t in self.tiers if t.name in self._batch}  # type: ignore[attr-defined]
        pending: dict[str, list[tuple[int, str, bytes]]] = {name: [] for name in present}
        stored = [0] * len(keys)
        everywhere_missing = [False] * len(keys)
        failures = written = 0
        writes = {t.name: 0 for t in self.tiers}
        for i, (key, chunk) in enumerate(zip(keys, chunks)):
            missing = [t for t in self.tiers if not (present[t.name][i] if t.name in present else t.contains(key))]
            if not missing:
                continue
            everywhere_missing[i] = len(missing) == len(self.tiers)
            data = self.codec.encode(chunk, key)
            sealed = None
            for t in missing:
                stored_as = self._sealing.stored_as(t.name, key, data, sealed, salt)
                sealed = stored_as if t.name in self._sealing.sealed else sealed
                if t.name in pending:
                    pending[t.name].append((i, key, stored_as))
                elif t.put(key, stored_as):
                    stored[i] += 1
                    written += len(stored_as)
                    writes[t.name] += 1
                else:
                    failures += 1
        for t in self.tiers:
            items = pending.get(t.name)
            if not items:
                continue
            for (i, _, data), ok in zip(items, t.put_many([(k, d) for _, k, d in items])):  # type: ignore[attr-defined]
                if ok:
                    stored[i] += 1
                    written += len(data)
                    writes[t.name] += 1
                else:
                    failures += 1
        new = sum(1 for i, n in enumerate(stored) if n and everywhere_missing[i])
        with self._lock:
            self._new += new
            self._puts += sum(stored)
            self._put_failures += failures
            self._bytes_written += written
            for name, n in writes.items():
                self._writes[name] += n
        return new

    def stored_hashes(self) -> list[BlockHash]:
        """Hashes of this namespace's chunks held by any tier (e.g. to announce a restarted
        replica's disk contents to the router). Reads keys only."""
        found: set[BlockHash] = set()
        for t in self.tiers:
            for key in t.keys():
                if key.startswith(self._prefix):
                    try:
                        found.add(int(key[len(self._prefix) :], 16))
                    except ValueError:
                        continue
        return sorted(found)

    def stats(self) -> dict[str, Any]:
        """Counters since construction plus each tier's own stats under "tiers". Per tier (dicts
        by tier name): "queries" (chunk reads asked of it: a tier is asked only after every
        faster one missed), "hits" (reads it served, verified), "writes" (chunks written to it,
        promotions included), "corrupt_by_tier" (reads that failed verification there).
        Store-wide: "misses" (reads no tier served, damaged ones included), "corrupt", "removed"
        (chunks no tier holds any more, reported to `watch_removed`)."""
        with self._lock:
            out: dict[str, Any] = {
                "queries": dict(self._queries),
                "hits": dict(self._hits),
                "writes": dict(self._writes),
                "misses": self._misses,
                "corrupt": self._corrupt,
                "corrupt_by_tier": dict(self._corrupt_by_tier),
                "promotions": self._promotions,
                "promotions_dropped": self._promoter.dropped,
                "puts": self._puts,
                "new_chunks": self._new,
                "put_failures": self._put_failures,
                "bytes_read": self._bytes_read,
                "bytes_written": self._bytes_written,
                "removed": self._removed,
                "auth_failures": self._sealing.auth_failures,
            }
        out["tiers"] = {t.name: t.stats() for t in self.tiers}
        return out

    def clear(self, tier: str | None = None) -> None:
        """Empty one tier by name (e.g. "memory" before a cold-start benchmark) or all. Clears
        the whole tier, including other namespaces' chunks if the tier is shared."""
        targets = self.tiers if tier is None else [t for t in self.tiers if t.name == tier]
        if not targets:
            raise ValueError(f"no tier named {tier!r}; have {[t.name for t in self.tiers]}")
        self._promoter.drain()  # so no queued promotion lands after the clear
        for t in targets:
            t.clear()

    def close(self) -> None:
        self._promoter.close()
        for t in self.tiers:
            t.close()
