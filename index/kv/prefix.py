"""PrefixIndex: which backend replica holds which KV blocks, and how long a prompt's cached
prefix is on each.

Keys are the chained block hashes of `kvgate.index.kv.hashing`: block i's hash covers every token up to
the end of block i. Two consequences shape this module:

* A replica can reuse block i only if it also holds blocks 0..i-1 (an engine's prefix cache is
  looked up from the front and stops at the first miss). So the useful number for routing is the
  count of LEADING hashes a replica holds, and `match` stops counting a replica at its first
  miss even if later hashes of the chain are present there (they are orphans the engine cannot
  reach without recomputing the missing block).
* Because a hash identifies its whole prefix, one flat table `hash -> holders` is enough; no
  tree is needed. `match` walks the chain once, intersecting holder sets, and stops as soon as no
  replica is left, so its cost is O(longest match), independent of the number of indexed blocks.

Two ways to feed it:

* approximate: `record(replica, hashes)` after routing a request to `replica`, mirroring the
  engine's LRU prefix cache with a per-replica capacity in blocks (guessing evictions);
* precise: `stored` / `removed` / `cleared` from the engine's KV cache events
  (`kvgate.index.kv.kv_events`), where the engine reports its own evictions. The capacity is then a memory
  bound, not a model of the engine (EVENT_FED_CAPACITY by default, far above what an engine
  holds): it only bites when removal events were lost or an engine holds more than it. Built with
  `touch_on_match=True`, `match` marks every replica's matched leading blocks most recently used,
  so at that bound the blocks evicted are the least recently stored or matched (an engine's hits
  produce no events: without this a hot system prompt stored long ago would go first).

Holders are kept as a bitmask (one bit per replica): intersecting is one `&`. Each block has an
entry in the holder table, one in each holding replica's LRU, and one in the successor table
(`forked`: which blocks several conversations continue, for cache_aware's wait bound). With the
C loops these are the C module's tables, hashes inline (kvgate.index.kv.prefix_tables);
otherwise dicts and OrderedDicts.

No single table is large: a table under steady churn rebuilds itself every so often, in one C
call that holds the GIL, and the larger the table the longer that call stalls the proxy's event
loop. So the holder and successor tables are HOLDER_SHARDS tables picked by the hash's low bits,
and a replica whose capacity is at least 2 × LRU_SHARD_BLOCKS keeps its LRU as a power of two of
shards picked by other bits of the hash, each with an equal share of the capacity
and evicting its own least recently used. Hashes are uniform, so each shard holds a random slice
of the blocks and its oldest block is among the globally oldest; the order is exact LRU only for
a single shard (capacities below 2 × LRU_SHARD_BLOCKS, e.g. every test of the exact order). A
shard may then evict a chain's block while another keeps a later one: `match` stops at the first
miss, so such an orphan costs space, never a wrong match.
"""

from __future__ import annotations

import itertools
import threading
import time
from types import ModuleType
from typing import Any, Iterable, Sequence

from kvgate.index.kv.hashing import BlockHash
from kvgate.index.kv.prefix_loops import HOLDER_SHARDS, loops, python_loops
from kvgate.index.kv.prefix_replica import LRU_SHARD_BLOCKS, Replica, check_capacity, lru_shards  # noqa: F401
from kvgate.index.kv.prefix_tables import NATIVE_MASK_BITS, new_tables, widened

# Default per-replica bound of an event-fed (precise mode) index, in blocks. Far above an engine's
# cache (a vLLM replica with 50 GB of KV at 128 KiB/token holds ~25k blocks of 16 tokens; with CPU
# offload maybe 10x), so it only matters when removal events are lost.
EVENT_FED_CAPACITY = 1 << 18
# successor table value of a block that recorded chains have continued in two different ways
_FORKED = object()
_GAP = object()  # resize's filler where an old shard has run out
# a record of a longer chain takes the lock in steps of this many blocks: a match waits for a step
RECORD_STEP = 128
YIELD_WAIT_S = 0.001  # between steps, the longest a record waits for a waiting match to take the lock
YIELD_NAP_S = 0.00005


class PrefixIndex:
    """Block hash → replicas holding it, with per-replica LRU capacity.

    Invariant: `self._holders[h & (HOLDER_SHARDS - 1)][h]` has bit b set exactly when `h` is in
    the LRU of the replica owning bit b; hashes held by no replica are absent (no zero masks are
    stored). Every LRU shard holds at most its share of the replica's capacity after each call.
    Every key of the successor tables is a held block (a record links its chain, then inserts it;
    a block's entry goes with its last holder, evicted or removed).

    Thread-safe: every public method takes one lock (events arrive on a subscriber thread while
    the router matches on another). A record of more than `record_step` blocks takes it once per
    step and lets a waiting `match` in between, so a long prompt's record delays a routing
    decision by a step, not by the whole chain.
    """

    def __init__(
        self,
        capacity_blocks: int | None = None,
        *,
        touch_on_match: bool = False,
        chain_loops: ModuleType | None = None,
        record_step: int = RECORD_STEP,
    ) -> None:
        """capacity_blocks: default per-replica capacity in blocks; None = unlimited.
        touch_on_match: `match` marks matched blocks most recently used (precise mode; see the
        module docstring). Off for approximate mode, where only the chosen replica's blocks are
        used, and `record` touches them.
        chain_loops: the per-block loops (kvgate.index.kv.prefix_loops); default: C where built.
        record_step: the most blocks a record applies per hold of the lock (RECORD_STEP)."""
        check_capacity(capacity_blocks)
        self._loops = chain_loops if chain_loops is not None else loops()
        self._default_capacity = capacity_blocks
        self._touch_on_match = touch_on_match
        self._replicas: dict[str, Replica] = {}
        self._by_slot: dict[int, Replica] = {}  # slot index -> replica, for decoding masks
        # holders: block → mask of its replicas; successors: block → the one block recorded after
        # it, or _FORKED once two different ones were (`forked`); both sharded by the hash's low bits
        self._holders, self._successors, self._new_lru = new_tables(self._loops, _FORKED)
        self._lock = threading.Lock()
        if record_step < 1:
            raise ValueError(f"record_step must be at least 1, got {record_step}")
        self._record_step = record_step
        self._matcher_waiting = False  # a match is waiting for the lock (set and read under the GIL)

    # -- replicas ---------------------------------------------------------------------------

    def add_replica(self, name: str, capacity_blocks: int | None = None) -> None:
        """Register a replica; capacity_blocks overrides the index default (None = default)."""
        cap = self._default_capacity if capacity_blocks is None else capacity_blocks
        check_capacity(cap)
        with self._lock:
            if name in self._replicas:
                raise ValueError(f"replica {name!r} already registered")
            slot = 0
            while slot in self._by_slot:  # reuse freed slots so masks stay small
                slot += 1
            if slot >= NATIVE_MASK_BITS:  # masks wider than the native tables hold
                self._holders, self._successors, self._new_lru = widened(
                    self._holders, self._successors, self._replicas.values()
                )
            rep = Replica(name=name, bit=1 << slot, capacity=cap, new_lru=self._new_lru)
            self._replicas[name] = rep
            self._by_slot[slot] = rep

    def resize(self, name: str, capacity_blocks: int | None) -> list[BlockHash]:
        """Give `name` a new bound (None = unlimited), keeping what it holds up to it. Returns the
        evicted hashes. The blocks move to the new bound's LRU shards, taken from the old shards
        oldest first and in turn, so each shard's order is kept and the oldest go first at the new
        bound (the order across old shards was never kept: see the module docstring)."""
        check_capacity(capacity_blocks)
        with self._lock:
            rep = self._get(name)
            if capacity_blocks == rep.capacity:
                return []
            # each old shard's i-th oldest block, for i = 0, 1, ... (shorter shards leave gaps)
            layers = itertools.zip_longest(*[list(lru) for lru in rep.shards], fillvalue=_GAP)
            rep.bound(capacity_blocks)
            for layer in layers:
                for h in layer:
                    if h is not _GAP:
                        rep.shard(h)[h] = None
            return self._evict_over_capacity(rep, set(range(len(rep.shards))))

    def remove_replica(self, name: str) -> None:
        """Forget a replica and every block it held."""
        with self._lock:
            rep = self._get(name)
            self._drop_all(rep)
            del self._replicas[name]
            del self._by_slot[rep.bit.bit_length() - 1]

    @property
    def native_loops(self) -> bool:
        """Whether the per-block loops run in C (kvgate.index.kv.prefix_loops)."""
        return self._loops is not python_loops()

    @property
    def replicas(self) -> list[str]:
        with self._lock:
            return list(self._replicas)

    # -- approximate mode -------------------------------------------------------------------

    def record(self, replica: str, hashes: Sequence[BlockHash], parent: BlockHash | None = None) -> list[BlockHash]:
        """A request with this block chain was served by `replica`: its blocks are now there.
        `parent`: the block before `hashes[0]` when the chain goes on from blocks recorded
        before (its link to `hashes[0]` is noted while it is held); None: the chain's start.

        Inserts missing blocks and marks all of them most recently used, then evicts least
        recently used blocks while over capacity. Returns the evicted hashes (oldest first).

        The chain is touched from its LAST block to its FIRST, so the first block ends up the
        most recent: like vLLM, which frees a finished request's blocks in reverse so the tail is
        evicted before the head. Evicting a head block would orphan every block after it.
        """
        if len(hashes) > self._record_step:
            return self._record_in_steps(replica, hashes, parent)
        with self._lock:
            rep = self._get(replica)
            held_parent = parent is not None and parent in self._holders[parent & (HOLDER_SHARDS - 1)]
            self._loops.link(self._successors, [parent, *hashes] if held_parent else hashes, _FORKED)
            return self._evict_over_capacity(rep, self._loops.insert(self._holders, rep.shards, rep.bit, hashes))

    def _record_in_steps(self, replica: str, hashes: Sequence[BlockHash], parent: BlockHash | None) -> list[BlockHash]:
        """`record` of a long chain, `record_step` blocks per hold of the lock, last step first,
        then the evictions in steps of the same size: a `match` waiting for the lock gets it
        between steps. With no other writer in between (approximate mode's one recorder thread;
        precise mode's events thread, when `match` does not touch), the tables end as one hold
        would leave them: each step links its blocks to the block after it, which the step
        before inserted, and nothing is evicted until the whole chain is most recently used.
        A replica removed between steps ends the record ([] evicted)."""
        step, end = self._record_step, len(hashes)
        grown: set[int] = set()
        rep: Replica | None = None
        layout: list[Any] | None = None
        held_parent = False
        while end > 0:
            start = max(0, end - step)
            with self._lock:
                current = self._get(replica) if rep is None else self._replicas.get(replica)
                if rep is not None and current is not rep:
                    return []
                if rep is None:  # whether the chain goes on from a held block: as before any step
                    held_parent = parent is not None and parent in self._holders[parent & (HOLDER_SHARDS - 1)]
                    rep, layout = current, current.shards
                links = [parent, *hashes[start : end + 1]] if start == 0 and held_parent else hashes[start : end + 1]
                self._loops.link(self._successors, links, _FORKED)
                grown |= self._loops.insert(self._holders, rep.shards, rep.bit, hashes[start:end])
            end = start
            self._let_matchers_in()
        evicted: list[BlockHash] = []
        while True:
            with self._lock:
                if rep is None or self._replicas.get(replica) is not rep:
                    return evicted
                if rep.shards is not layout:  # resized between steps: any shard may be over
                    grown, layout = set(range(len(rep.shards))), rep.shards
                out = self._evict_over_capacity(rep, grown, step)
            evicted += out
            if len(out) < step:
                return evicted
            self._let_matchers_in()

    def _let_matchers_in(self) -> None:
        """Between a long record's steps: while a `match` waits for the lock (and at most
        YIELD_WAIT_S), sleep, so it takes the lock rather than this thread taking it again."""
        deadline = time.monotonic() + YIELD_WAIT_S
        while self._matcher_waiting and time.monotonic() < deadline:
            time.sleep(YIELD_NAP_S)

    # -- precise mode (engine events) -------------------------------------------------------

    def stored(self, replica: str, hashes: Sequence[BlockHash], parent: BlockHash | None = None) -> list[BlockHash]:
        """The engine reports these blocks stored on `replica`, after block `parent` (None: the
        chain's first block, or a parent unknown here).

        Same bookkeeping as `record` (the engine reports evictions itself, so the replica's
        capacity is a memory bound above the engine's size, in case removal events are lost).
        Returns hashes evicted by that bound, if any (oldest first; counted in `stats()`).
        """
        return self.record(replica, hashes, parent)

    def removed(self, replica: str, hashes: Iterable[BlockHash]) -> None:
        """The engine reports these blocks evicted from `replica`; unknown hashes are ignored."""
        with self._lock:
            rep = self._get(replica)
            self._loops.remove(self._holders, self._successors, rep.shards, hashes, ~rep.bit)

    def cleared(self, replica: str) -> None:
        """The engine reports its whole prefix cache reset."""
        with self._lock:
            self._drop_all(self._get(replica))

    # -- queries ----------------------------------------------------------------------------

    def match(self, hashes: Sequence[BlockHash]) -> dict[str, int]:
        """For every replica, how many leading hashes of `hashes` it holds.

        Stops counting a replica at its first miss (see the module docstring: a later block
        without its predecessors is unusable), and stops the walk when no replica is left, so
        the cost is O(longest match). Without touch_on_match it does not change LRU order
        (routing decides afterwards, and `record` marks the chosen replica's blocks); with it,
        every replica's matched blocks become most recently used, last to first like `record`,
        which adds O(sum of the match lengths).
        """
        if not self._lock.acquire(blocking=False):  # a long record holds it: ask it to step aside
            self._matcher_waiting = True
            self._lock.acquire()
        try:
            self._matcher_waiting = False
            result = dict.fromkeys(self._replicas, 0)
            by_slot = self._by_slot
            holders = self._holders
            active = 0
            for rep in self._replicas.values():
                active |= rep.bit
            walk, i, n = self._loops.walk, 0, len(hashes)
            while active:
                i, still = walk(holders, hashes, i, active)
                if i == n:  # every replica still in the walk holds the whole chain
                    self._settle(result, by_slot, active, n)
                    break
                self._settle(result, by_slot, active & ~still, i)
                active = still
                i += 1
            if self._touch_on_match:
                self._touch(result, hashes)
            return result
        finally:
            self._lock.release()

    def blocks(self, replica: str) -> int:
        """Number of blocks the index believes `replica` holds."""
        with self._lock:
            return len(self._get(replica))

    def held(self, h: BlockHash) -> bool:
        """Whether any replica holds block `h`. Lock-free (one table look-up, atomic under the GIL):
        a hint for where hashing may stop (kvgate.index.kv.prompt), which `Router.prepare` re-checks."""
        return h in self._holders[h & (HOLDER_SHARDS - 1)]

    def forked(self, h: BlockHash) -> bool:
        """Whether chains recorded or stored through block `h` went on from it in at least two
        different ways: a prefix that more than one conversation extends (a shared document or
        system prompt), as opposed to one conversation's own history, which only its next turn
        extends. Forgotten with the block. Lock-free (one table look-up, atomic under the GIL).
        Precise mode sees the links within each stored batch and to its `parent`."""
        return self._successors[h & (HOLDER_SHARDS - 1)].get(h) is _FORKED

    def shared_match(self, hashes: Sequence[BlockHash], matched: dict[str, int]) -> bool:
        """Whether the longest match in `matched` (as `match` gave it for `hashes`) ends at a
        `forked` block: a prefix several conversations share, not one conversation's own history.
        False without a match."""
        best = max(matched.values(), default=0)
        return best > 0 and self.forked(hashes[best - 1])

    def holds(self, replica: str, h: BlockHash) -> bool:
        """Whether the index believes `replica` holds block `h` (no LRU effect)."""
        with self._lock:
            return h in self._get(replica)

    def capacity(self, replica: str) -> int | None:
        """`replica`'s bound in blocks (None = unbounded)."""
        with self._lock:
            return self._get(replica).capacity

    def stats(self) -> dict[str, object]:
        """{'blocks': {replica: n}, 'evictions': {replica: n}, 'capacity': {replica: cap},
        'unique_blocks': distinct hashes held anywhere}."""
        with self._lock:
            reps = self._replicas.values()
            return {
                "blocks": {r.name: len(r) for r in reps},
                "evictions": {r.name: r.evictions for r in reps},
                "capacity": {r.name: r.capacity for r in reps},
                "unique_blocks": sum(len(d) for d in self._holders),
            }

    # -- internals (lock held) --------------------------------------------------------------

    def _get(self, name: str) -> Replica:
        try:
            return self._replicas[name]
        except KeyError:
            raise KeyError(f"unknown replica {name!r}") from None

    def _touch(self, matched: dict[str, int], hashes: Sequence[BlockHash]) -> None:
        """Mark each replica's first matched[name] hashes most recently used, last to first."""
        for name, n in matched.items():
            if n:
                self._loops.touch(self._replicas[name].shards, hashes, n)

    def _evict_over_capacity(self, rep: Replica, grown: set[int], most: int | None = None) -> list[BlockHash]:
        """Evict least recently used blocks from the shards in `grown` while over their share
        (at most `most` blocks this call, shards in order; None: all that are over)."""
        if rep.capacity is None or not grown:
            return []
        keep, evict = ~rep.bit, self._loops.evict
        evicted: list[BlockHash] = []
        for slot in sorted(grown):
            lru, cap = rep.shards[slot], rep.caps[slot]
            over = len(lru) - cap  # type: ignore[operator]  # bounded replicas have int caps
            if most is not None:
                over = min(over, most - len(evicted))
            if over > 0:
                evicted += evict(self._holders, self._successors, lru, over, keep)
        rep.evictions += len(evicted)
        return evicted

    def _drop_all(self, rep: Replica) -> None:
        keep = ~rep.bit
        for lru in rep.shards:
            self._loops.evict(self._holders, self._successors, lru, len(lru), keep)

    @staticmethod
    def _settle(result: dict[str, int], by_slot: dict[int, Replica], mask: int, n: int) -> None:
        """Give every replica whose bit is in `mask` a match length of n."""
        while mask:
            low = mask & -mask
            result[by_slot[low.bit_length() - 1].name] = n
            mask ^= low
