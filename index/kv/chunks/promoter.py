"""Promoter: copies of loaded chunks into the slower local tiers, off the request path.

A chunk loaded from the remote tier is copied into RAM at once (the next read wants it there)
and into the disk tier by this one worker thread: that copy only matters once RAM has evicted
the chunk, and writing chunk-sized files (megabytes each) while the request waits for its first
token can cost more than the Redis read itself. The queue is bounded; a copy that does not
fit is dropped (counted) — the chunk is still in RAM and in the tier it came from.

The copies also wait while their owner holds them (`hold`): a replica holds them while it
prefills, so a request's first token does not share the CPU with chunk-sized file writes (on a
small machine they delay a warm request's first token). A copy held longer than MAX_HOLD_S runs
anyway, so a replica that is never idle still fills its disk tier.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

log = logging.getLogger("kvgate.chunks")

QUEUE_DEPTH = 64  # pending copies (~12 MB each for SmolLM2 float32 chunks: ≤ ~750 MB held)
MAX_HOLD_S = 2.0  # the longest a copy waits for its owner's hold to end


class Promoter:
    """One daemon thread running submitted copies in order. Thread-safe; `drain()` waits until
    every copy submitted before it has run; after `close()` submissions are refused."""

    def __init__(self, depth: int = QUEUE_DEPTH, max_hold_s: float = MAX_HOLD_S) -> None:
        self._open = threading.Event()  # set: copies may run; cleared by hold()
        self._open.set()
        self.max_hold_s = max_hold_s
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=depth)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.dropped = 0
        self.overdue = 0  # copies run while still held, their max_hold_s over (written by the thread only)

    def submit(self, job: Callable[[], None]) -> bool:
        """Queue `job`; False (counted in `dropped`) when the queue is full or closed."""
        with self._lock:
            if self._closed:
                self.dropped += 1
                return False
            if self._thread is None:  # started on first use: stores that never promote have none
                self._thread = threading.Thread(target=self._run, name="kv-promoter", daemon=True)
                self._thread.start()
            try:
                self._jobs.put_nowait(job)
            except queue.Full:
                self.dropped += 1
                return False
        return True

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if not self._open.wait(self.max_hold_s):
                    self.overdue += 1
                job()
            except Exception:  # a failed copy costs a slower later read, never the request
                log.exception("background chunk promotion failed")
            finally:
                self._jobs.task_done()

    def hold(self, held: bool) -> None:
        """While held, queued copies wait (each at most max_hold_s); any thread."""
        if held:
            self._open.clear()
        else:
            self._open.set()

    def drain(self) -> None:
        """Wait for every queued copy to finish."""
        if self._thread is not None:
            self._jobs.join()

    def close(self) -> None:
        """Finish the queued copies, then stop the thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._open.set()
        if thread is not None:
            self._jobs.put(None)
            thread.join()
