"""ZMQ transport of KV event batches, framed like vLLM: ``[topic, seq, payload]``.

`seq` is the batch number, 8 bytes big-endian, counting from 0 per publisher; `payload` is one
msgpack batch (kvgate.index.kv.kv_events.codec). Subscribers also accept ``[topic, payload]``.

Socket roles. vLLM's publisher binds a wildcard or ipc endpoint and *connects* to a concrete
address (`tcp://127.0.0.1:5557`), so for such an engine the subscriber is the side that binds
(`bind=True`); our reference replica binds, and the subscriber connects.

Replay. vLLM keeps its last batches behind an optional ROUTER socket (`replay_endpoint`): a
DEALER sends ``[b"", start_seq]`` and gets ``[b"", topic, seq, payload]`` for every buffered
batch from `start_seq` on, then ``[b"", b"", -1, b""]``. On a sequence gap the subscriber asks
for the missing batches there first; only what the replay cannot give becomes a gap (a resync).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import zmq

from kvgate.index.kv.kv_events.applier import EventApplier
from kvgate.index.kv.kv_events.codec import KVEvent, KVEventBatch, encode_batch
from kvgate.index.kv.kv_events.feed import EventFeed
from kvgate.index.kv.kv_events.waker import Waker

log = logging.getLogger(__name__)


class ZmqEventSubscriber:
    """SUB socket on a daemon thread: each message goes to an EventFeed (order, decode, apply).

    `stats()` is the feed's snapshot as a dict: batches, events, decode errors, apply errors,
    sequence gaps (the index may then be stale until the engine stores/evicts those blocks
    again), duplicates, restarts, lag, and what the applier did.
    """

    def __init__(
        self,
        endpoint: str,
        applier: EventApplier,
        topic: bytes = b"",
        context: zmq.Context | None = None,
        *,
        bind: bool = False,
        replay: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.applier = applier
        self.topic = topic
        self.bind = bind
        self.replay = replay
        self.replayed = 0  # batches recovered through the replay socket
        self.feed = EventFeed(applier, source=f"{applier.replica} ({endpoint})")
        self._ctx = context or zmq.Context.instance()
        self._stop = threading.Event()
        self._waker = Waker()  # the thread sleeps in its poll until a message or stop() comes
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "ZmqEventSubscriber":
        """Start the thread; returns once the socket is connected and subscribed."""
        if self._thread is not None:
            raise RuntimeError("subscriber already started")
        self._thread = threading.Thread(target=self._run, name=f"kv-events-{self.applier.replica}", daemon=True)
        self._thread.start()
        self._ready.wait(5.0)
        return self

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        self._waker.wake()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            self._waker.close()

    def stats(self) -> dict[str, Any]:
        return self.feed.stats().as_dict()

    def _run(self) -> None:
        sock = self._ctx.socket(zmq.SUB)  # sockets are single-thread: create it here
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, self.topic)
            try:
                if self.bind:
                    self._bind(sock)
                else:
                    sock.connect(self.endpoint)
            except zmq.ZMQError as exc:  # the view stays empty (routing by load), and says why
                log.error(
                    "KV events of %s: cannot %s %s: %s",
                    self.applier.replica,
                    "listen on" if self.bind else "connect to",
                    self.endpoint,
                    exc,
                )
                return
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(self._waker.fd, zmq.POLLIN)
            self._ready.set()
            while not self._stop.is_set():
                if sock not in dict(poller.poll()):
                    continue
                while True:  # drain what is queued before polling again
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._handle(frames)
        finally:
            self._ready.set()
            sock.close(linger=0)

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) == 3:
            seq = int.from_bytes(frames[1], "big", signed=True)
            last = self.feed.last_seq
            if self.replay is not None and last is not None and seq > last + 1:
                self._catch_up(last + 1, seq)
            self.feed.receive(seq, frames[2])
        elif len(frames) == 2:
            self.feed.receive(None, frames[1])
        else:
            self.feed.malformed(f"message with {len(frames)} frames ignored")

    def _bind(self, sock: zmq.Socket) -> None:
        """Bind, waiting out a socket on the same address that is still closing (ZMQ closes in
        its I/O thread, after close() returns): a subscriber restarted for the same engine."""
        deadline = time.monotonic() + BIND_WAIT_S
        while True:
            try:
                sock.bind(self.endpoint)
                return
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline or self._stop.is_set():
                    raise
                time.sleep(0.05)

    def _catch_up(self, start: int, stop: int) -> None:
        """Feed batches start..stop-1 from the publisher's replay buffer (what it still has)."""
        assert self.replay is not None
        sock = self._ctx.socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.replay)
            sock.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + REPLAY_TIMEOUT_S
            while time.monotonic() < deadline:
                if not sock.poll(int(REPLAY_TIMEOUT_S * 1000)):
                    break
                frames = sock.recv_multipart()
                if len(frames) != 4:
                    continue
                seq = int.from_bytes(frames[2], "big", signed=True)
                if seq < 0:
                    break  # end of the buffer
                if start <= seq < stop and seq == (self.feed.last_seq or 0) + 1:
                    self.feed.receive(seq, frames[3])
                    self.replayed += 1
        except zmq.ZMQError:
            pass  # no replay: the gap is resynced as without one
        finally:
            sock.close(linger=0)


BIND_WAIT_S = 5.0  # how long a bind waits for the address to be released
REPLAY_TIMEOUT_S = 1.0  # a replay that does not answer this fast is skipped (the gap then resyncs)


class ZmqEventPublisher:
    """PUB socket bound to `endpoint`, sending ``[topic, seq, payload]`` like vLLM.

    `endpoint` may use port ``*`` (e.g. ``tcp://127.0.0.1:*``); `self.endpoint` is then the
    address actually bound. ZMQ PUB drops messages for subscribers not yet connected (the
    "slow joiner"), so early batches may be missed; subscribers count the gap. publish() may
    be called from several threads (a lock serializes the socket).
    """

    def __init__(
        self,
        endpoint: str,
        topic: bytes = b"",
        data_parallel_rank: int | None = None,
        context: zmq.Context | None = None,
    ) -> None:
        self.topic = topic
        self.data_parallel_rank = data_parallel_rank
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._seq = 0
        self._lock = threading.Lock()
        self._closed = False

    def publish(self, events: list[KVEvent]) -> int:
        """Send one batch of events; returns its sequence number."""
        batch = KVEventBatch(ts=time.time(), events=list(events), data_parallel_rank=self.data_parallel_rank)
        payload = encode_batch(batch)
        with self._lock:
            if self._closed:
                raise RuntimeError("publisher is closed")
            seq = self._seq
            self._seq += 1
            self._sock.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._sock.close(linger=0)

    def __enter__(self) -> "ZmqEventPublisher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
