"""EventApplier: one replica's KV cache events applied to a PrefixIndex, in the router's hash space.

Media. vLLM tags each BlockStored / BlockRemoved with the `medium` it concerns: "GPU" for the
engine's own prefix cache, "CPU" (or a connector's name) for a copy an offloading connector keeps.
A block evicted from one medium but still held in another is still reusable without a prefill, so
the applier tracks, per engine block, the set of media holding it: the block stays in the prefix
index while any medium holds it and leaves it when the last one reports it removed. A BlockStored
without a medium counts as "GPU" (vLLM had no other medium before the field existed); a
BlockRemoved without a medium removes the block from every medium. A BlockStored for blocks
already mapped (e.g. an offload copy: vLLM sends those without token ids) only adds the medium.

Bounds. The map engine hash → our hash holds only blocks the index holds for this replica, so it
is bounded by the index's per-replica capacity (precise mode's default: kvgate.index.kv.prefix's
EVENT_FED_CAPACITY): blocks the index evicts at its bound are forgotten here too. When several
engine hashes map to one of ours (same tokens, different engine extras such as a LoRA or a cache
salt), `max_mapped` (default twice the index capacity) caps the map; the least recently stored
mapping goes first, and its block leaves the index if no other engine hash maps to it.

Invariant (checked by tests): the blocks the index holds for this replica are exactly the our
hashes some mapped engine hash maps to; len(mapped) <= max_mapped.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Callable, Protocol, Sequence

from kvgate.index.kv.engine_hash import checkable_salt, vllm_first_block_hash
from kvgate.index.kv.hashing import DEFAULT_SEED, BlockHash, block_hashes, salted_seed, seed_hash
from kvgate.index.kv.kv_events.codec import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineHash,
    KVEvent,
    KVEventBatch,
)
from kvgate.index.kv.prefix import PrefixIndex

log = logging.getLogger(__name__)

MAPPED_PER_BLOCK = 2  # default max_mapped = this x the index's capacity for the replica
CHECK_FIRST, CHECK_EVERY = 8, 64  # engine-hash checks: the first root blocks, then one in this many


class TierSink(Protocol):
    """Where KV-tier media go (middleware/routing/tiers.py): the index replica holding a medium's
    blocks for a replica, or None for media that stay with the replica itself."""

    def tier_of(self, replica: str, medium: str | None) -> str | None: ...

    def forget(self, replica: str) -> None: ...


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
    BlockRemoved of unknown engine hashes is a no-op. See the module docstring for media and
    bounds.

    Not thread-safe by itself: one applier is driven by one subscriber thread.
    """

    def __init__(
        self,
        index: PrefixIndex,
        replica: str,
        block_size: int | None,
        extra: Sequence[str | int] = (),
        seed: str = DEFAULT_SEED,
        max_mapped: int | None = None,
        on_block_size: Callable[[str, int], None] | None = None,
        tiers: TierSink | None = None,
    ) -> None:
        """max_mapped: cap on engine hashes remembered; default MAPPED_PER_BLOCK x the index's
        capacity for `replica` (None when that is unbounded, or `replica` is not registered yet).
        block_size None: taken from the first BlockStored, then `on_block_size(replica, size)`.
        tiers: where a KV tier's media go. Such an event is applied to the tier's own index
        replica, for the blocks this replica's engine already reported (a tier stores only blocks
        the engine computed, which its engine events announced first); blocks the mapping has
        forgotten by the time a tier evicts them are left to the tier replica's capacity bound."""
        if block_size is not None and block_size <= 0:
            raise ValueError("block_size must be positive")
        if max_mapped is None:
            cap = index.capacity(replica) if replica in index.replicas else None
            max_mapped = None if cap is None else max(1, MAPPED_PER_BLOCK * cap)
        elif max_mapped < 1:
            raise ValueError("max_mapped must be >= 1")
        self.index = index
        self.replica = replica
        self.block_size = block_size
        self.extra = tuple(extra)
        self.seed = seed
        self.max_mapped = max_mapped
        self._root = seed_hash(seed)
        # engine hash -> (our hash, bitmask of the media holding it); least recently stored first
        self._ours: OrderedDict[EngineHash, tuple[BlockHash, int]] = OrderedDict()
        # our hash -> the engine hashes mapping to it (one, or a list when they collide)
        self._engine: dict[BlockHash, EngineHash | list[EngineHash]] = {}
        self._media: dict[str, int] = {}  # medium name -> its bit
        self._bad_sizes: set[int] = set()
        self._counts = {
            "stored": 0,
            "removed": 0,
            "cleared": 0,
            "wrong_block_size": 0,
            "unknown_parent": 0,
            "bound_evictions": 0,
            "forgotten": 0,
            "engine_hash_checked": 0,
            "engine_hash_differs": 0,
        }
        self._on_block_size = on_block_size
        self._tiers = tiers
        self._roots_seen = 0  # first blocks of chains seen (the engine-hash check samples them)

    def set_block_size(self, block_size: int) -> None:
        """Cut tokens at `block_size` from now on; a change forgets what was mapped (blocks cut
        elsewhere match nothing the router hashes)."""
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        if block_size != self.block_size:
            changed = self.block_size is not None
            self.block_size = block_size
            self._bad_sizes.discard(block_size)
            if changed:
                self.reset()

    def apply_batch(self, batch: KVEventBatch) -> None:
        """Apply the batch's events in order."""
        for ev in batch.events:
            self.apply(ev)

    def apply(self, event: KVEvent) -> None:
        if isinstance(event, BlockStored):
            self._stored(event)
        elif isinstance(event, BlockRemoved):
            self._removed(event)
        elif isinstance(event, AllBlocksCleared):
            self.reset()
        else:
            raise TypeError(f"not a KV event: {event!r}")

    def reset(self) -> None:
        """Forget everything this replica holds (cache cleared, engine restarted, or events lost)."""
        self.index.cleared(self.replica)
        if self._tiers is not None:
            self._tiers.forget(self.replica)
        self._ours.clear()
        self._engine.clear()
        self._counts["cleared"] += 1

    @property
    def stored(self) -> int:
        """Blocks stored so far (stats()["stored"] without building the dict: read per request)."""
        return self._counts["stored"]

    def our_hash(self, engine_hash: EngineHash) -> BlockHash | None:
        """Our hash for an engine block hash, if that block is known to be stored."""
        found = self._ours.get(engine_hash)
        return None if found is None else found[0]

    def media(self, engine_hash: EngineHash) -> set[str]:
        """The media an engine block is known to be held in (empty when unknown)."""
        found = self._ours.get(engine_hash)
        mask = 0 if found is None else found[1]
        return {name for name, bit in self._media.items() if mask & bit}

    def stats(self) -> dict[str, int]:
        """Blocks stored / removed (ours), clears (resets included), events ignored
        (wrong_block_size, unknown_parent), blocks the index's bound evicted
        (bound_evictions), mappings dropped at max_mapped (forgotten), and `mapped`: engine
        hashes currently known. Readable from any thread (a copy of ints; the subscriber thread
        only bumps them)."""
        return {**self._counts, "mapped": len(self._ours)}

    # -- events -------------------------------------------------------------------------------

    def _stored(self, ev: BlockStored) -> None:
        if self.block_size is None:
            self.block_size = ev.block_size
            if self._on_block_size is not None:
                self._on_block_size(self.replica, ev.block_size)
        if ev.block_size != self.block_size:
            self._counts["wrong_block_size"] += 1
            if ev.block_size not in self._bad_sizes:
                self._bad_sizes.add(ev.block_size)
                log.warning(
                    "replica %s: ignoring KV events with block_size %d (ours is %d)",
                    self.replica,
                    ev.block_size,
                    self.block_size,
                )
            return
        known = [self._ours.get(h) for h in ev.block_hashes]
        tier = self._tiers.tier_of(self.replica, ev.medium) if self._tiers is not None else None
        if tier is not None:
            self.index.stored(tier, [k[0] for k in known if k is not None])
            return
        if all(k is not None for k in known):  # a re-store or another medium: no tokens needed
            ours = [k[0] for k in known if k is not None]
        else:
            computed = self._our_chain(ev)
            if computed is None:
                return
            ours = computed
        bit = self._bit(ev.medium or MEDIUM_GPU)
        for engine_h, our_h in zip(ev.block_hashes, ours):
            self._map(engine_h, our_h, bit)
        parent = self._ours.get(ev.parent_block_hash) if ev.parent_block_hash is not None else None
        evicted = self.index.stored(self.replica, ours, parent=None if parent is None else parent[0])
        for our_h in evicted:  # the index's bound dropped them: forget their engine hashes too
            self._unmap_our(our_h)
        self._counts["stored"] += len(ours)
        self._counts["bound_evictions"] += len(evicted)
        self._enforce_max_mapped()

    def _our_chain(self, ev: BlockStored) -> list[BlockHash] | None:
        """Our hashes of the event's blocks, chained from our hash of its parent; None (counted)
        when the parent is unknown."""
        if ev.parent_block_hash is None:
            self._check_engine_hash(ev)
            parent = self._root_of(ev)
        else:
            found = self._ours.get(ev.parent_block_hash)
            if found is None:
                self._counts["unknown_parent"] += 1
                log.debug("replica %s: BlockStored with unknown parent, skipped", self.replica)
                return None
            parent = found[0]
        ours = block_hashes(ev.token_ids, self.block_size, parent=parent, extra=self.extra, seed=self.seed)
        if len(ours) != len(ev.block_hashes):
            # Should not happen with vLLM (token_ids are exactly the new full blocks); keep
            # the blocks both sides agree on.
            log.warning(
                "replica %s: BlockStored has %d hashes but %d full blocks of tokens",
                self.replica,
                len(ev.block_hashes),
                len(ours),
            )
            ours = ours[: len(ev.block_hashes)]
        return ours

    def _check_engine_hash(self, ev: BlockStored) -> None:
        """Whether the engine hashes first blocks as vLLM's default sha256 does (kvgate.index.kv.engine_hash):
        the first few root blocks, then one in CHECK_EVERY."""
        seen, self._roots_seen = self._roots_seen, self._roots_seen + 1
        if (seen >= CHECK_FIRST and seen % CHECK_EVERY) or not isinstance(ev.block_hashes[0], int):
            return
        ok, salt = checkable_salt(ev.extra_keys[0] if ev.extra_keys else None)
        if not ok or len(ev.token_ids) < ev.block_size:
            return
        self._counts["engine_hash_checked"] += 1
        if vllm_first_block_hash(ev.token_ids[: ev.block_size], salt) != ev.block_hashes[0]:
            self._counts["engine_hash_differs"] += 1

    def _root_of(self, ev: BlockStored) -> BlockHash:
        """The parent of a chain's first block: our seed, moved by the first block's extra keys
        when the engine salted the request (vLLM publishes its cache_salt there, untagged), as
        PromptHasher.prompt(salt=...) moves it."""
        keys = ev.extra_keys[0] if ev.extra_keys else None
        if not keys:
            return self._root
        return seed_hash(salted_seed(self.seed, "\x1f".join(str(k) for k in keys)))

    def _removed(self, ev: BlockRemoved) -> None:
        tier = self._tiers.tier_of(self.replica, ev.medium) if self._tiers is not None else None
        if tier is not None:
            self.index.removed(tier, [k[0] for h in ev.block_hashes if (k := self._ours.get(h)) is not None])
            return
        keep = 0 if ev.medium is None else ~self._bit(ev.medium)
        gone: list[BlockHash] = []
        for engine_h in ev.block_hashes:
            found = self._ours.get(engine_h)
            if found is None:
                continue
            our_h, mask = found
            mask &= keep
            if mask:  # still held in another medium
                self._ours[engine_h] = (our_h, mask)
                continue
            del self._ours[engine_h]
            if self._unlink(our_h, engine_h):
                gone.append(our_h)
        self.index.removed(self.replica, gone)
        self._counts["removed"] += len(gone)

    # -- the map ------------------------------------------------------------------------------

    def _bit(self, medium: str) -> int:
        bit = self._media.get(medium)
        if bit is None:
            bit = self._media[medium] = 1 << len(self._media)
        return bit

    def _map(self, engine_h: EngineHash, our_h: BlockHash, bit: int) -> None:
        found = self._ours.get(engine_h)
        if found is not None:
            self._ours[engine_h] = (our_h, found[1] | bit)
            self._ours.move_to_end(engine_h)
            return
        self._ours[engine_h] = (our_h, bit)
        others = self._engine.get(our_h)
        if others is None:
            self._engine[our_h] = engine_h
        elif isinstance(others, list):
            others.append(engine_h)
        else:
            self._engine[our_h] = [others, engine_h]

    def _unlink(self, our_h: BlockHash, engine_h: EngineHash) -> bool:
        """Drop engine_h from our_h's engine hashes; True when none is left (the block is gone)."""
        others = self._engine.get(our_h)
        if isinstance(others, list):
            if engine_h in others:
                others.remove(engine_h)
            if len(others) > 1:
                return False
            if others:
                self._engine[our_h] = others[0]
                return False
        elif others is not None and others != engine_h:
            return False
        self._engine.pop(our_h, None)
        return True

    def _unmap_our(self, our_h: BlockHash) -> None:
        """Forget every engine hash mapping to our_h (the index no longer holds it)."""
        others = self._engine.pop(our_h, None)
        for engine_h in others if isinstance(others, list) else () if others is None else (others,):
            self._ours.pop(engine_h, None)

    def _enforce_max_mapped(self) -> None:
        if self.max_mapped is None:
            return
        gone: list[BlockHash] = []
        while len(self._ours) > self.max_mapped:
            engine_h, (our_h, _) = self._ours.popitem(last=False)
            self._counts["forgotten"] += 1
            if self._unlink(our_h, engine_h):
                gone.append(our_h)
        if gone:
            self.index.removed(self.replica, gone)
