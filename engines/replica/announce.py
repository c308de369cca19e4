"""KV event announcements of one replica engine: which chunks it holds, for a router in precise mode.

on_stored(hashes, token_ids, parent) follows vLLM's BlockStored with block_size = chunk_tokens:
hashes of chunks newly held, token_ids their tokens (len = len(hashes) · chunk_tokens), parent
the hash before the first (None at the chain's start). "Newly" is per engine: a chunk another
replica wrote to a shared disk tier, or one left from before a restart, is announced the first
time this engine uses it, so an event's parent was always announced earlier by this engine (the
router's EventApplier needs that to follow the chain).

on_removed(hashes) follows vLLM's BlockRemoved. What "removed" means here: the replica's prefix
cache is its whole ChunkStore (RAM, then disk), and a chunk evicted from RAM but still on disk is
loaded, not prefilled. So a chunk is announced removed only when NO tier holds it any more
(ChunkStore.watch_removed), and both kinds of event carry one medium for the store as a whole
(the server publishes MEDIUM_CPU): the router's applier, which tracks media per block, then sees
a block leave exactly when it stops being loadable. Announcing per tier ("CPU" for RAM, "DISK")
would tell a router where a chunk sits, which no policy uses, at the price of a stored event per
promotion. Also announced removed: chunks this announcer forgets (it remembers `memory` of them,
least recently used first), so the router never holds more of this replica's chunks than the
announcer remembers; a forgotten chunk still in the store is announced again when next used.

Not seen: evictions by another process sharing the disk tier (its store hears of them, not
ours). The router then believes this replica holds a chunk it lost: it pays a prefill, never gets
wrong output, and its own per-replica bound ages the entry out.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any, Callable, Sequence

from index.hashing import BlockHash

log = logging.getLogger("kvgate.replica")

ANNOUNCED_MEMORY = 1 << 16  # chunk hashes an engine remembers having announced

StoredCallback = Callable[[list[BlockHash], list[int], BlockHash | None], None]
RemovedCallback = Callable[[list[BlockHash]], None]


def emit(callback: Callable[..., None] | None, *args: Any) -> None:
    """Call `callback(*args)` if set; a broken publisher is logged and must not fail the request."""
    if callback is None:
        return
    try:
        callback(*args)
    except Exception:
        log.exception("KV event callback failed")


class Announcer:
    """Remembers the chunk hashes announced (the last `memory` of them, least recently used
    forgotten first, and announced removed) and announces each chain's chunks beyond the
    announced ones, and announced chunks that the store lost.

    Invariant: every hash announced stored and not since announced removed is in `_announced`.
    Thread-safe: the engine's worker stores, and a store eviction may come from any thread that
    writes to the store; events are emitted under the lock, so they leave in a consistent order.
    """

    def __init__(self, chunk_tokens: int, on_stored: StoredCallback | None = None,
                 on_removed: RemovedCallback | None = None, memory: int = ANNOUNCED_MEMORY) -> None:
        if memory < 1:
            raise ValueError("memory must be >= 1")
        self.chunk_tokens = chunk_tokens
        self.on_stored = on_stored
        self.on_removed = on_removed
        self.memory = memory
        self._announced: OrderedDict[BlockHash, None] = OrderedDict()
        self._lock = threading.RLock()

    def stored(self, hashes: Sequence[BlockHash], tokens: Sequence[int]) -> None:
        """on_stored for the chunks of the chain `hashes` (over `tokens`) not announced before.
        The chain is walked from its start, so the first new chunk's parent was announced."""
        if self.on_stored is None:
            return
        with self._lock:
            announced = self._announced
            seen = 0
            while seen < len(hashes) and hashes[seen] in announced:
                announced.move_to_end(hashes[seen])
                seen += 1
            if seen == len(hashes):
                return
            new = list(hashes[seen:])
            for h in new:
                announced[h] = None
            ct = self.chunk_tokens
            parent = hashes[seen - 1] if seen else None
            emit(self.on_stored, new, list(tokens[seen * ct : len(hashes) * ct]), parent)
            forgotten = []
            while len(announced) > self.memory:
                forgotten.append(announced.popitem(last=False)[0])
            if forgotten:
                emit(self.on_removed, forgotten)

    def removed(self, hashes: Sequence[BlockHash]) -> None:
        """The store lost these chunks (no tier holds them): on_removed for the announced ones,
        which are forgotten, so they are announced again if stored again."""
        with self._lock:
            gone = [h for h in hashes if h in self._announced]
            for h in gone:
                del self._announced[h]
            if gone:
                emit(self.on_removed, gone)

    def cleared(self) -> None:
        """Forget what was announced and report it removed (e.g. after store.clear())."""
        with self._lock:
            held = list(self._announced)
            self._announced.clear()
            if held:
                emit(self.on_removed, held)
