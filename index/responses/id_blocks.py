"""Entry ids taken from blocks reserved with one counter increment.

Reserving an id costs a write to the shared store (a SQLite transaction, a Redis round trip);
under a steady stream of misses that write is a large part of storing an answer. `IdBlocks`
reserves several at once when ids are being used up fast, and one at a time otherwise.

Other processes list every reserved id in their change log and retry an id not stored yet for
`Follower.pending_s` (10 s by default); a block therefore serves ids for at most `ttl_s` after it
was reserved, and what is left of it then is skipped (ids need not be contiguous or all used).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MAX_BLOCK = 32  # ids reserved at once at most: what a busy process stores in well under ttl_s
BLOCK_TTL_S = 2.0  # well inside Follower.pending_s, so a reader still waits for every id used


class IdBlocks:
    """Unique ids from `reserve(n)` (n fresh ids), handed out one at a time.

    Invariant: every id handed out came from `reserve`, is handed out once, and no later than
    `ttl_s` after the `reserve` call that returned it. The block size doubles (up to `max_block`)
    while blocks run out before they expire and halves when one expires unfinished."""

    def __init__(
        self,
        reserve: Callable[[int], list[int]],
        on_reserve: Callable[[list[int]], None] | None = None,
        max_block: int = MAX_BLOCK,
        ttl_s: float = BLOCK_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reserve = reserve
        self._on_reserve = on_reserve
        self.max_block = max_block
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._ids: list[int] = []  # what is left of the current block, next id last
        self._reserved_at = 0.0
        self.size = 1  # the next block's size

    def take(self) -> int:
        """One fresh id (reserving a block when none is left or the current one expired)."""
        with self._lock:
            now = self._clock()
            expired = now - self._reserved_at > self.ttl_s
            if self._ids and not expired:
                return self._ids.pop()
            if self._ids:  # expired unfinished: smaller blocks from now on
                self.size = max(1, self.size // 2)
            elif not expired and self._reserved_at:  # used up in time: larger ones
                self.size = min(self.max_block, self.size * 2)
            block = self._reserve(self.size)
            if self._on_reserve is not None:
                self._on_reserve(block)
            self._reserved_at = now
            self._ids = block[::-1]
            return self._ids.pop()
