"""The wake-up pipe of threads that sleep in a ZMQ poll (index/kv/kv_events/waker.py), and the KV-event
subscriber that sleeps on it: idle, its thread does not wake; stopped, it leaves at once."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import zmq

from kvgate.index.kv.kv_events import EventApplier, ZmqEventPublisher, ZmqEventSubscriber
from kvgate.index.kv.kv_events.waker import Waker
from kvgate.index.kv.prefix import PrefixIndex


def test_a_wake_releases_a_poll_without_timeout_and_close_releases_the_descriptors():
    waker = Waker()
    poller = zmq.Poller()
    poller.register(waker.fd, zmq.POLLIN)
    assert poller.poll(0) == []
    released = threading.Event()

    def sleeper() -> None:
        poller.poll()  # no timeout: only the wake ends it
        released.set()

    thread = threading.Thread(target=sleeper, daemon=True)
    thread.start()
    assert not released.wait(0.2)
    waker.wake()
    assert released.wait(5)
    for _ in range(100_000):  # a full pipe is no error: a byte is waiting already
        waker.wake()
    fd = waker.fd
    waker.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    waker.wake()  # after close: nothing written anywhere
    waker.close()


def _voluntary_switches(tid: int) -> int:
    for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def test_an_idle_subscriber_sleeps_and_stops_at_once():
    ctx = zmq.Context()
    index = PrefixIndex()
    index.add_replica("r")
    publisher = ZmqEventPublisher("tcp://127.0.0.1:*", context=ctx)
    subscriber = ZmqEventSubscriber(publisher.endpoint, EventApplier(index, "r", 16), context=ctx).start()
    try:
        thread = subscriber._thread
        assert thread is not None and thread.native_id is not None
        time.sleep(0.2)
        before = _voluntary_switches(thread.native_id)
        time.sleep(1.0)
        # asleep in its poll: a thread that polled with a 100 ms timeout woke ~10 times here
        assert _voluntary_switches(thread.native_id) - before <= 2
        subscriber.stop(timeout=5)
        assert not thread.is_alive()
    finally:
        subscriber.stop()
        publisher.close()
        ctx.term()
