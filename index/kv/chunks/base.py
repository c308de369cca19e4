"""The StorageTier protocol: a byte store for encoded KV chunks, one implementation per file.

A tier stores opaque bytes under string keys and knows nothing of tensors, of chunk validity
(ChunkStore verifies every read with the codec) or of the other tiers (ChunkStore composes them).
Eviction is each tier's own business; a tier may drop any key at any time, so `contains` is a
hint that a later `get` can contradict, and callers must treat a `get` of None as a miss.

A tier may also offer `watch_evictions(callback)`: `callback(keys)` after its own eviction
dropped `keys` (MemoryTier and DiskTier do). It is optional, so it is not part of the Protocol;
ChunkStore uses it when present to tell the engine which chunks no tier holds any more.

A tier may also set `in_process = True` (MemoryTier does): its bytes stay in the engine process's
own memory, so a ChunkStore with a cipher stores them unsealed (kvgate.index.kv.chunks.sealing);
every other tier holds sealed chunks.

A tier whose every call is a network round trip (RedisTier) also implements BatchTier: the
chunks of one prompt then go in one round trip each way, and ChunkStore uses the batch calls for
it (isinstance check) instead of one call per chunk.
"""

from __future__ import annotations

from typing import Iterator, Protocol, Sequence, runtime_checkable


@runtime_checkable
class StorageTier(Protocol):
    """Byte store under a byte budget. Implementations are thread-safe.

    Failure contract: `put` returns False when it could not store (value bigger than the budget,
    disk full, lock timeout) and never raises for those; `get` returns None for a missing key.
    """

    name: str  # short and unique within a ChunkStore, e.g. "memory", "disk"

    def get(self, key: str) -> bytes | None:
        """The stored bytes, or None. Counts as a use for LRU order. May raise
        codec.CorruptChunk when the key is listed but its value is known to be lost (a dead
        row); ChunkStore then drops the key everywhere."""
        ...

    def put(self, key: str, data: bytes) -> bool:
        """Store `data` (a key already present is kept as it is and counts as stored)."""
        ...

    def contains(self, key: str) -> bool:
        """Whether `key` is stored; reads no value and does not change LRU order."""
        ...

    def delete(self, key: str) -> None:
        """Remove `key` if present."""
        ...

    def keys(self) -> Iterator[str]:
        """The stored keys (a snapshot, in no promised order), e.g. to announce a disk tier's
        contents after a restart."""
        ...

    def clear(self) -> None:
        """Remove every key."""
        ...

    def stats(self) -> dict[str, int]:
        """At least: items, bytes, budget_bytes, evictions."""
        ...

    def close(self) -> None:
        """Release resources; the tier is not used afterwards."""
        ...


@runtime_checkable
class BatchTier(StorageTier, Protocol):
    """A StorageTier with one-round-trip calls over many keys (same failure contract)."""

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        """`contains` of each key, in order."""
        ...

    def get_many(self, keys: Sequence[str]) -> list[bytes]:
        """The values of the leading run of stored keys: stops at the first missing one."""
        ...

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[bool]:
        """`put` of each (key, value), in order."""
        ...
