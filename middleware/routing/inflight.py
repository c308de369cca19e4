"""Precise mode's view of prefixes on their way into a replica's cache.

An engine reports a block only once it has computed it, so in precise mode requests that share a
prefix and arrive together (a system prompt, a document, a benchmark's shared prefix) all see no
replica holding it, and load balancing spreads them: each replica prefills the same prefix. Here
a routed request's block chain counts as held by its replica from the moment it is sent, under a
replica of its own in the prefix index (`routed@<name>`), until a short while after the request
has finished, by which time the engine's own events say what it really holds.

Invariants: a block stays under `routed@R` while at least one request routed to R with it is in
flight or in its grace period (counted per block); `fold` gives each replica the longer of its
engine-reported and its routed match, and leaves no `routed@` entry in the result.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Sequence

from kvgate.index.kv.block_counts import BlockCounts
from kvgate.index.kv.hashing import BlockHash
from kvgate.index.kv.prefix import PrefixIndex

ROUTED = "routed@"
GRACE_S = 1.0  # after a request finished: the engine's events for its blocks arrive within this


class InFlightPrefixes:
    def __init__(self, index: PrefixIndex, clock: Callable[[], float] = time.monotonic) -> None:
        self.index = index
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, BlockCounts] = {}
        self._due: deque[tuple[float, str, tuple[BlockHash, ...]]] = deque()

    def sent(self, replica: str, hashes: Sequence[BlockHash]) -> None:
        """A request with these prompt blocks was sent to `replica`."""
        self.expire()
        if not hashes:
            return
        name = ROUTED + replica
        with self._lock:
            if name not in self.index.replicas:
                self.index.add_replica(name)
            counts = self._counts.get(replica)
            if counts is None:
                counts = self._counts[replica] = BlockCounts()
            counts.add(hashes)
        self.index.record(name, hashes)

    def done(self, replica: str, hashes: Sequence[BlockHash]) -> None:
        """That request finished (or failed): its blocks stop counting after the grace period."""
        if hashes:
            with self._lock:
                self._due.append((self._clock() + GRACE_S, replica, tuple(hashes)))
        self.expire()

    def fold(self, matched: dict[str, int]) -> dict[str, int]:
        """`matched` (PrefixIndex.match, after `expire`) with each replica's routed match folded
        into its own."""
        out = {k: v for k, v in matched.items() if not k.startswith(ROUTED)}
        for key, blocks in matched.items():
            if key.startswith(ROUTED) and blocks:
                replica = key[len(ROUTED) :]
                if replica in out:
                    out[replica] = max(out[replica], blocks)
        return out

    def forget(self, replica: str) -> None:
        """The replica left or its engine is gone: nothing is on its way there any more."""
        with self._lock:
            self._counts.pop(replica, None)
            known = ROUTED + replica in self.index.replicas
        if known:
            self.index.cleared(ROUTED + replica)

    def expire(self) -> None:
        """Drop the blocks whose grace period is over (before matching: cheap when none is)."""
        now = self._clock()
        gone: dict[str, list[BlockHash]] = {}
        with self._lock:
            while self._due and self._due[0][0] <= now:
                _, replica, hashes = self._due.popleft()
                counts = self._counts.get(replica)
                dropped = counts.drop(hashes) if counts is not None else []
                if dropped:
                    gone.setdefault(replica, []).extend(dropped)
        for replica, hashes in gone.items():
            self.index.removed(ROUTED + replica, hashes)
