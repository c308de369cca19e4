"""EventApplier: one replica's KV cache events applied to a PrefixIndex, in the router's hash space."""
from __future__ import annotations

import logging
from typing import Sequence

from index.hashing import DEFAULT_SEED, BlockHash, block_hashes, seed_hash
from index.kv_events.codec import AllBlocksCleared, BlockRemoved, BlockStored, EngineHash, KVEvent, KVEventBatch
from index.prefix import PrefixIndex

log = logging.getLogger(__name__)


class EventApplier:
    """Applies one replica's engine events to a PrefixIndex, in OUR hash space.

    The engine's block hashes use its own function and seed, so they are not comparable with
    the hashes the router computes. For BlockStored we recompute ours from the event's
    token_ids, chained from our hash of the event's parent block (looked up in a per-replica
    map engine hash -> our hash, filled by earlier BlockStored events), or from our seed when
    the parent is None. Because both hash chains cover the same token prefixes, the mapping is
    one-to-one along a chain.

    Ignored, and counted in `stats()`:
    * events whose block_size differs from ours (their blocks cut the tokens at other
      boundaries, so no hash of ours corresponds to them; logged once per size);
    * BlockStored whose parent we never saw (e.g. we subscribed after the engine stored it):
      without our parent hash the chain cannot be continued.
    BlockRemoved of unknown engine hashes is a no-op. The map is kept bounded by dropping
    entries on BlockRemoved and AllBlocksCleared (a lost removal event leaves one entry behind).

    Not thread-safe by itself: one applier is driven by one subscriber thread.
    """

    def __init__(
        self,
        index: PrefixIndex,
        replica: str,
        block_size: int,
        extra: Sequence[str | int] = (),
        seed: str = DEFAULT_SEED,
    ) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.index = index
        self.replica = replica
        self.block_size = block_size
        self.extra = tuple(extra)
        self.seed = seed
        self._root = seed_hash(seed)
        self._ours: dict[EngineHash, BlockHash] = {}
        self._bad_sizes: set[int] = set()
        self._counts = {"stored": 0, "removed": 0, "cleared": 0, "wrong_block_size": 0,
                        "unknown_parent": 0}

    def apply_batch(self, batch: KVEventBatch) -> None:
        """Apply the batch's events in order."""
        for ev in batch.events:
            self.apply(ev)

    def apply(self, event: KVEvent) -> None:
        if isinstance(event, BlockStored):
            self._stored(event)
        elif isinstance(event, BlockRemoved):
            ours = [self._ours.pop(h) for h in event.block_hashes if h in self._ours]
            self.index.removed(self.replica, ours)
            self._counts["removed"] += len(ours)
        elif isinstance(event, AllBlocksCleared):
            self.reset()
        else:
            raise TypeError(f"not a KV event: {event!r}")

    def reset(self) -> None:
        """Forget everything this replica holds (cache cleared or engine restarted)."""
        self.index.cleared(self.replica)
        self._ours.clear()
        self._counts["cleared"] += 1

    def our_hash(self, engine_hash: EngineHash) -> BlockHash | None:
        """Our hash for an engine block hash, if that block is known to be stored."""
        return self._ours.get(engine_hash)

    def stats(self) -> dict[str, int]:
        """Blocks stored / removed (ours), clears, events ignored (wrong_block_size,
        unknown_parent), and `mapped`: engine hashes currently known. Readable from any thread
        (a copy of ints; the subscriber thread only bumps them)."""
        return {**self._counts, "mapped": len(self._ours)}

    def _stored(self, ev: BlockStored) -> None:
        if ev.block_size != self.block_size:
            self._counts["wrong_block_size"] += 1
            if ev.block_size not in self._bad_sizes:
                self._bad_sizes.add(ev.block_size)
                log.warning("replica %s: ignoring KV events with block_size %d (ours is %d)",
                            self.replica, ev.block_size, self.block_size)
            return
        if ev.parent_block_hash is None:
            parent = self._root
        else:
            found = self._ours.get(ev.parent_block_hash)
            if found is None:
                self._counts["unknown_parent"] += 1
                log.debug("replica %s: BlockStored with unknown parent, skipped", self.replica)
                return
            parent = found
        ours = block_hashes(ev.token_ids, self.block_size, parent=parent, extra=self.extra,
                            seed=self.seed)
        if len(ours) != len(ev.block_hashes):
            # Should not happen with vLLM (token_ids are exactly the new full blocks); keep
            # the blocks both sides agree on.
            log.warning("replica %s: BlockStored has %d hashes but %d full blocks of tokens",
                        self.replica, len(ev.block_hashes), len(ours))
            ours = ours[: len(ev.block_hashes)]
        for engine_h, our_h in zip(ev.block_hashes, ours):
            self._ours[engine_h] = our_h
        self.index.stored(self.replica, ours)
        self._counts["stored"] += len(ours)

