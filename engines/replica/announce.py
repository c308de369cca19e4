"""KV event announcements of one replica engine: which chunks it holds, for a router in precise mode.

on_stored(hashes, token_ids, parent) follows vLLM's BlockStored with block_size = chunk_tokens:
hashes of chunks newly held, token_ids their tokens (len = len(hashes) · chunk_tokens), parent
the hash before the first (None at the chain's start). "Newly" is per engine: a chunk another
replica wrote to a shared disk tier, or one left from before a restart, is announced the first
time this engine uses it, so an event's parent was always announced earlier by this engine (the
router's EventApplier needs that to follow the chain).

Eviction is not reported: ChunkStore tiers evict inside put() and do not say which keys went, so
a router in precise mode may believe a replica holds chunks it evicted (it then pays a prefill,
never gets wrong output); its own per-replica capacity bound ages them out. on_removed is
accepted for symmetry with SimEngine and only called by `cleared`.
"""
from __future__ import annotations

import logging
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
    forgotten first) and announces each chain's chunks beyond the announced ones."""

    def __init__(self, chunk_tokens: int, on_stored: StoredCallback | None = None,
                 on_removed: RemovedCallback | None = None, memory: int = ANNOUNCED_MEMORY) -> None:
        self.chunk_tokens = chunk_tokens
        self.on_stored = on_stored
        self.on_removed = on_removed
        self.memory = memory
        self._announced: OrderedDict[BlockHash, None] = OrderedDict()

    def stored(self, hashes: Sequence[BlockHash], tokens: Sequence[int]) -> None:
        """on_stored for the chunks of the chain `hashes` (over `tokens`) not announced before.
        The chain is walked from its start, so the first new chunk's parent was announced."""
        if self.on_stored is None:
            return
        seen = 0
        while seen < len(hashes) and hashes[seen] in self._announced:
            self._announced.move_to_end(hashes[seen])
            seen += 1
        if seen == len(hashes):
            return
        new = list(hashes[seen:])
        for h in new:
            self._announced[h] = None
        while len(self._announced) > self.memory:
            self._announced.popitem(last=False)
        ct = self.chunk_tokens
        parent = hashes[seen - 1] if seen else None
        emit(self.on_stored, new, list(tokens[seen * ct : len(hashes) * ct]), parent)

    def cleared(self) -> None:
        """Forget what was announced and report it removed (e.g. after store.clear())."""
        held = list(self._announced)
        self._announced.clear()
        if held:
            emit(self.on_removed, held)
