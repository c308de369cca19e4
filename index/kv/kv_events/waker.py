"""A wake-up pipe for threads that sleep in a ZMQ poll.

A subscriber thread that polled with a timeout only to notice `stop()` woke ten times a second
for nothing, idle or not; with the pipe's read end registered beside its sockets it sleeps until
a message or `wake()` comes. Invariant: after `wake()`, every poll that watches `fd` returns at
once until `close()`; `wake()` after `close()` does nothing (the descriptor numbers are never
written once released, so another file that reuses them is never touched).
"""

from __future__ import annotations

import os
import threading
import weakref


class Waker:
    """`fd`: register it with zmq.POLLIN; `wake()` from any thread; `close()` once the polling
    thread is gone."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._lock = threading.Lock()
        # the descriptors go with the object if nobody closed it (a subscriber never stopped)
        self._release = weakref.finalize(self, _close_both, self._read, self._write)

    @property
    def fd(self) -> int:
        return self._read

    def wake(self) -> None:
        with self._lock:
            if not self._release.alive:
                return
            try:
                os.write(self._write, b"\0")
            except BlockingIOError:  # the pipe is full: a byte is waiting already
                pass

    def close(self) -> None:
        with self._lock:
            self._release()


def _close_both(read: int, write: int) -> None:
    os.close(read)
    os.close(write)
