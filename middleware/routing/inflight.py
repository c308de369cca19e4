"""Precise mode's view of prefixes on their way into a replica's cache.

An engine reports a block only once it has computed it, so in precise mode requests that share a
prefix and arrive together (a system prompt, a document, a benchmark's shared prefix) all see no
replica holding it, and load balancing spreads them: each replica prefills the same prefix. Here
a routed request's block chain counts as held by its replica from the moment it is sent, under a
replica of its own in the prefix index (`routed@<name>`), until a short while after the request
has finished, by which time the engine's own events say what it really holds.

A request routed on a *partial* prompt (hashed only up to a block no replica held, a long new
message matched on a lead of it: kvgate.index.kv.prompt) is recorded with the blocks it has, and
with `deferred` a thread of this view's own completes the prompt (tokenises and hashes the rest,
which also leaves its chain states in the hasher's cache for the next turn) and adds the rest of
its chain under `routed@R`, unless the request's blocks were dropped meanwhile; so requests
sharing a long new prefix still find all of it on its way to one replica. At most
MAX_PENDING_COMPLETIONS wait for that thread; past them a request keeps the blocks it has.

Invariants: a block stays under `routed@R` while at least one request routed to R with it is in
flight or in its grace period (counted per block); `fold` gives each replica the longer of its
engine-reported and its routed match, and leaves no `routed@` entry in the result; what a
request added under `routed@R` is counted and removed under one lock, so a completion that comes
after its request's blocks were dropped adds nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

from kvgate.index.kv.block_counts import BlockCounts
from kvgate.index.kv.hashing import BlockHash
from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.kv.prompt import PromptHashes

log = logging.getLogger("kvgate.router")

ROUTED = "routed@"
GRACE_S = 1.0  # after a request finished: the engine's events for its blocks arrive within this
# completions queued at most; past it a request stays in flight with the blocks it was routed on
MAX_PENDING_COMPLETIONS = 64


@dataclass(eq=False)
class Routed:
    """One request's blocks under `routed@<replica>` (`sent` returns it, `done` takes it back)."""

    replica: str
    hashes: tuple[BlockHash, ...]
    counts: BlockCounts  # the replica's counts it was added to (a forgotten replica's are gone)
    live: bool = True  # False once its blocks were dropped


class InFlightPrefixes:
    def __init__(self, index: PrefixIndex, clock: Callable[[], float] = time.monotonic, deferred: bool = False) -> None:
        """`deferred`: a partial prompt is completed on a thread of this view's own (else its
        caller completes it, when it needs to)."""
        self.index = index
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, BlockCounts] = {}
        self._due: deque[tuple[float, Routed]] = deque()
        self._completer = ThreadPoolExecutor(1, thread_name_prefix="kvgate-complete") if deferred else None
        self._pending = 0  # completions submitted and not yet done, under _lock

    @property
    def deferred(self) -> bool:
        return self._completer is not None

    def close(self) -> None:
        if self._completer is not None:
            self._completer.shutdown(wait=True)

    def sent(self, replica: str, hashes: Sequence[BlockHash], prompt: PromptHashes | None = None) -> Routed | None:
        """A request with these prompt blocks was sent to `replica`; `prompt`: the hashes they
        came from, completed later (module docstring) when partial."""
        self.expire()
        if not hashes:
            return None
        name = ROUTED + replica
        partial = prompt is not None and prompt.partial and self._completer is not None
        with self._lock:
            if name not in self.index.replicas:
                self.index.add_replica(name)
            counts = self._counts.get(replica)
            if counts is None:
                counts = self._counts[replica] = BlockCounts()
            entry = Routed(replica, tuple(hashes), counts)
            counts.add(entry.hashes)
            self.index.record(name, entry.hashes)
            completes = partial and self._pending < MAX_PENDING_COMPLETIONS
            if completes:
                self._pending += 1
        if completes and self._completer is not None:
            try:
                self._completer.submit(self._complete, entry, prompt)
            except RuntimeError:  # closed: a request sent while the proxy shuts down
                self._completed()
        return entry

    def _completed(self) -> None:
        with self._lock:
            self._pending -= 1

    def done(self, entry: Routed | None) -> None:
        """That request finished (or failed): its blocks stop counting after the grace period."""
        if entry is not None:
            with self._lock:
                self._due.append((self._clock() + GRACE_S, entry))
        self.expire()

    def _complete(self, entry: Routed, prompt: PromptHashes) -> None:
        try:
            full = prompt.complete().hashes
        except Exception:  # a prompt left partial costs a shorter routed prefix, never the request
            log.exception("completing a routed prompt's hashes for replica %s failed", entry.replica)
            return
        finally:
            self._completed()
        have = len(entry.hashes)
        # a lead that is not how its message begins hashed other blocks (the hasher says so): keep those
        if len(full) <= have or tuple(full[:have]) != entry.hashes:
            return
        rest = full[have:]
        with self._lock:
            if not entry.live or self._counts.get(entry.replica) is not entry.counts:
                return
            entry.counts.add(rest)
            self.index.record(ROUTED + entry.replica, rest, entry.hashes[-1])
            entry.hashes += tuple(rest)

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
        with self._lock:
            while self._due and self._due[0][0] <= now:
                _, entry = self._due.popleft()
                entry.live = False
                if self._counts.get(entry.replica) is not entry.counts:
                    continue  # the replica was forgotten since: its blocks went with it
                dropped = entry.counts.drop(entry.hashes)
                if dropped:
                    self.index.removed(ROUTED + entry.replica, dropped)
