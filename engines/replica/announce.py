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

Remote medium. With a remote tier (a Redis other replicas share, kvgate.index.kv.chunks.redis) a chunk can
leave RAM and disk and still be loadable, from Redis, at network speed. Such a chunk is announced
as moved: BlockStored with medium "REMOTE" (no token ids: the router knows the block, the applier
only adds the medium) then BlockRemoved "CPU" (ChunkStore.watch_demoted). When a request uses it
again it is back in RAM (promotion), announced the other way round. So every announced chunk has
one medium, the fastest place this replica loads it from, and BlockRemoved for it names that
medium. Redis's own evictions are not seen, like another process's disk evictions.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any, Callable, Sequence

from kvgate.index.kv.hashing import BlockHash

# kvgate.index.kv.kv_events' MEDIUM_CPU / MEDIUM_REMOTE (equal: tested), not imported: that package pulls in zmq
LOCAL, REMOTE = "CPU", "REMOTE"
log = logging.getLogger("kvgate.replica")

ANNOUNCED_MEMORY = 1 << 16  # chunk hashes an engine remembers having announced

StoredCallback = Callable[..., None]  # (hashes, token_ids, parent[, medium]): the medium only on a move
RemovedCallback = Callable[..., None]  # (hashes[, medium]): the medium only for remote-held chunks


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

    Invariant: every hash announced stored and not since announced removed is in `_announced`,
    mapped to True when it was last announced as held by the remote tier only.
    Thread-safe: the engine's worker stores, and a store eviction may come from any thread that
    writes to the store; events are emitted under the lock, so they leave in a consistent order.
    """

    def __init__(
        self,
        chunk_tokens: int,
        on_stored: StoredCallback | None = None,
        on_removed: RemovedCallback | None = None,
        memory: int = ANNOUNCED_MEMORY,
    ) -> None:
        if memory < 1:
            raise ValueError("memory must be >= 1")
        self.chunk_tokens = chunk_tokens
        self.on_stored = on_stored
        self.on_removed = on_removed
        self.memory = memory
        self._announced: OrderedDict[BlockHash, bool] = OrderedDict()  # hash → remote only
        self._lock = threading.RLock()

    def stored(self, hashes: Sequence[BlockHash], tokens: Sequence[int]) -> None:
        """on_stored for the chunks of the chain `hashes` (over `tokens`) not announced before.
        The chain is walked from its start, so the first new chunk's parent was announced. Chunks
        announced as remote-only are local again (a request just used them): moved back."""
        if self.on_stored is None:
            return
        with self._lock:
            announced = self._announced
            back = [h for h in hashes if announced.get(h)]
            for h in back:
                announced[h] = False
            self._moved(back, LOCAL, REMOTE)
            seen = 0
            while seen < len(hashes) and hashes[seen] in announced:
                announced.move_to_end(hashes[seen])
                seen += 1
            if seen == len(hashes):
                return
            new = list(hashes[seen:])
            for h in new:
                announced[h] = False
            ct = self.chunk_tokens
            parent = hashes[seen - 1] if seen else None
            emit(self.on_stored, new, list(tokens[seen * ct : len(hashes) * ct]), parent)
            forgotten = []
            while len(announced) > self.memory:
                forgotten.append(announced.popitem(last=False))
            self._removed(forgotten)

    def demoted(self, hashes: Sequence[BlockHash]) -> None:
        """The store's local tiers lost these chunks but its remote tier holds them: announced
        chunks move to the remote medium."""
        with self._lock:
            moved = [h for h in hashes if h in self._announced and not self._announced[h]]
            for h in moved:
                self._announced[h] = True
            self._moved(moved, REMOTE, LOCAL)

    def removed(self, hashes: Sequence[BlockHash]) -> None:
        """The store lost these chunks (no tier holds them): on_removed for the announced ones,
        which are forgotten, so they are announced again if stored again."""
        with self._lock:
            gone = [(h, self._announced.pop(h)) for h in hashes if h in self._announced]
            self._removed(gone)

    def _moved(self, hashes: list[BlockHash], to: str, away: str) -> None:
        """Announce `hashes` (known to the router) as held in medium `to` and no longer in `away`."""
        if hashes:
            emit(self.on_stored, hashes, [], None, to)
            emit(self.on_removed, hashes, away)

    def _removed(self, held: list[tuple[BlockHash, bool]]) -> None:
        """on_removed for (hash, remote only) pairs: local ones in the default medium, remote
        ones naming theirs."""
        local = [h for h, remote in held if not remote]
        remote = [h for h, is_remote in held if is_remote]
        if local:
            emit(self.on_removed, local)
        if remote:
            emit(self.on_removed, remote, REMOTE)
