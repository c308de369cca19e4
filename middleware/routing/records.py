"""Approximate mode's records: which replica now caches which block chain, applied to the prefix
index (and shared through the routing state) in order, off the caller's thread when deferred.

With deferral (the proxy's routers) the records run in order on one background thread instead of
the event loop. Past MAX_PENDING_RECORDS queued records the caller applies its own inline, and a
short chain with nothing queued before it is applied at once: a hop to the recorder would cost
more than the record. A partial prompt's chain is hashed to its end by whoever applies it; one
with text still to tokenise (a long message matched on its lead) always goes to the recorder:
tokenising it is work that grows with the prompt, kept off the caller; past MAX_PENDING_COSTLY
queued it is dropped instead (the queue stays bounded; a warning says so once).

A caller about to match a prompt may wait for the queued records first (`settle`); given the
prompt's chain it waits only when a queued chain starts with the same block. Block hashes are
chained, so a chain with another first block shares no block with the prompt: applying it cannot
raise the prompt's match (it can only evict, in the index's model of a full replica, what a match
a moment later would no longer see).

Invariant: records of one router are applied in the order they were submitted, whichever thread
applies them (a chain is applied inline only when nothing is queued before it); `_firsts` counts
the first blocks of exactly the records queued and not yet applied.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor, wait

from kvgate.index.kv.prefix import PrefixIndex
from kvgate.index.kv.prompt import PromptHashes
from kvgate.middleware.routing.state import RoutingState

log = logging.getLogger("kvgate.router")

MAX_PENDING_RECORDS = 64  # deferred records queued before a caller applies its own inline
INLINE_RECORD_BLOCKS = 128  # a chain this short is applied at once when nothing is queued
# past this many queued, a record with a message still to tokenise is dropped (a worse route
# later, never the request) rather than queued: each holds its prompt's text until applied
MAX_PENDING_COSTLY = 4 * MAX_PENDING_RECORDS


class Records:
    def __init__(self, index: PrefixIndex, state: RoutingState, deferred: bool) -> None:
        self.index = index
        self.state = state
        self._recorder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvgate-index") if deferred else None
        self._last: Future[None] | None = None
        # the first blocks of the chains submitted and not yet applied (None: not hashed yet), under _lock
        self._firsts: Counter[int | None] = Counter()
        self._lock = threading.Lock()
        self.dropped = 0  # records dropped with the queue past MAX_PENDING_COSTLY

    @property
    def deferred(self) -> bool:
        return self._recorder is not None

    def close(self) -> None:
        if self._recorder is not None:
            self._recorder.shutdown(wait=True)

    def record(self, replica: str, chain: list[int] | PromptHashes, held: int = 0) -> None:
        """`replica` now caches this chain (in order; off this thread when deferred). `held`: its
        leading blocks the index already has there, left where they are in the LRU (a caller
        that records the whole chain again soon, as the answer's record does, passes the match)."""
        if self._recorder is not None:
            blocks = (chain.blocks if isinstance(chain, PromptHashes) else len(chain)) - held
            costly = isinstance(chain, PromptHashes) and chain.untokenized
            first = first_block(chain)
            with self._lock:
                # a short chain with nothing before it in the queue stays in order applied here
                pending = self._firsts.total()
                if costly and pending >= MAX_PENDING_COSTLY:
                    self.dropped += 1
                    if self.dropped == 1:
                        log.warning(
                            "the router's recorder is %d records behind: records of new long prompts are dropped "
                            "until it catches up (those prompts route worse on their next turn)",
                            pending,
                        )
                    return
                queued = costly or (pending < MAX_PENDING_RECORDS and (pending > 0 or blocks > INLINE_RECORD_BLOCKS))
                if queued:
                    self._firsts[first] += 1
            if queued:
                try:
                    self._last = self._recorder.submit(self._deferred, replica, chain, held, first)
                    return
                except RuntimeError:  # closed: a request finishing while the proxy shuts down
                    self._dequeued(first)
        self._apply(replica, chain, held)

    def settle(self, timeout: float | None = None, chain: list[int] | None = None) -> bool:
        """Wait until the records submitted so far are in the index, at most `timeout` seconds
        (None: however long). True when they are (at once when not deferred). With `chain` (the
        leading block hashes of a prompt about to be matched), True at once unless a queued record
        could add to its match: one whose chain starts with the same block (module docstring)."""
        if chain is not None:
            with self._lock:
                if not (self._firsts[None] or (chain and self._firsts[chain[0]])):
                    return True
        last = self._last
        if last is None:
            return True
        done, _ = wait([last], timeout=timeout)
        return bool(done)

    def _deferred(self, replica: str, chain: list[int] | PromptHashes, held: int, first: int | None) -> None:
        try:
            self._apply(replica, chain, held)
        finally:
            self._dequeued(first)

    def _dequeued(self, first: int | None) -> None:
        with self._lock:
            self._firsts[first] -= 1
            if not self._firsts[first]:
                del self._firsts[first]

    def _apply(self, replica: str, chain: list[int] | PromptHashes, held: int) -> None:
        try:
            hashes = chain.complete().hashes if isinstance(chain, PromptHashes) else chain
            if held > 0:
                self.index.record(replica, hashes[held:], hashes[held - 1])
            else:
                self.index.record(replica, hashes)
            self.state.recorded(replica, hashes)
        except Exception:  # a record lost costs a worse route later, never the request
            log.exception("route record for replica %s failed", replica)


def first_block(chain: list[int] | PromptHashes) -> int | None:
    """A chain's first block hash (pure); None while a partial prompt has hashed none of it."""
    hashes = chain.hashes if isinstance(chain, PromptHashes) else chain
    return hashes[0] if hashes else None
