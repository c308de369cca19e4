"""WorkerState: the routing state of `kvgate serve --workers N` — N processes on one host.

Load: one shared-memory table (a file in /dev/shm mapped by every worker) of int64 counters
shaped (worker, slot, 2), one slot per (route, replica), holding requests in flight and pending
prefill tokens. A worker writes only its own row, so no lock is needed anywhere: a reader sums
the column over workers and may see another worker's count a moment old, never a torn one (an
aligned 8-byte store is atomic on the platforms we run on).

Routing decisions: each worker binds a ZMQ PUB socket on an ipc:// endpoint in the same
directory and subscribes to every other worker's; `recorded` publishes ``[route, replica,
hashes]`` (msgpack) and a subscriber thread applies the others' records to this worker's prefix
index. The hashes are already in the router's own hash space (every worker hashes alike), so
they are applied as they are, unlike an engine's BlockStored events (kvgate.index.kv.kv_events), which
carry token ids to be re-hashed. Delivery is lossy by design (a PUB socket drops for a
subscriber not yet connected, or past its high-water mark): a lost record costs a prefill.

Replica lists: what the admin API adds or removes in one worker reaches every worker through a
file in the same directory (fleet_workers.py); the hub nudges the other workers when it changes
(a control message on the same sockets) and looks at the file every CHECK_S in case a nudge was
lost. The load table has spare columns per route for the replicas added so.

Not shared: replica health (each worker marks a replica down on its own failures and probes it
on its own), the precise mode's event feeds (each worker subscribes to the replicas itself) and
the engines' /metrics (each worker reads them itself: the same numbers).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import msgspec
import numpy as np
import zmq

from kvgate.index.kv.kv_events.waker import Waker
from kvgate.middleware.routing.fleet_workers import CHECK_S, SPARE_SLOTS, SharedFleet, spare_key
from kvgate.middleware.routing.state import ApplyRecord

log = logging.getLogger("kvgate.workers")

LOAD_FILE = "load.i64"
SNDHWM = 10_000  # records queued per peer before the PUB socket drops (a lost record is a prefill)
FLEET_CHANGED = "\x00fleet"  # the route of a control message: the shared replica lists changed


def _slot_key(route: str, replica: str) -> str:
    return f"{route}\x00{replica}"


@dataclass(frozen=True)
class WorkersLayout:
    """What every worker must agree on: where the shared files are, how many workers, the slots."""

    directory: str
    workers: int
    slots: dict[str, int]  # _slot_key(route, replica) -> column of the load table

    @classmethod
    def create(cls, routes: Sequence[tuple[str, Sequence[str]]], workers: int) -> "WorkersLayout":
        """Make the directory and a zeroed load table for `routes` ((route, replica names))."""
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        directory = tempfile.mkdtemp(prefix="kvgate-workers-", dir=base)
        keys = [_slot_key(route, name) for route, names in routes for name in names]
        keys += [spare_key(route, i) for route, _ in routes for i in range(SPARE_SLOTS)]  # added at run time
        slots = {key: i for i, key in enumerate(keys)}
        size = max(1, workers * len(slots) * 2) * 8
        with open(os.path.join(directory, LOAD_FILE), "wb") as fh:
            fh.truncate(size)
        return cls(directory, workers, slots)

    def endpoint(self, worker: int) -> str:
        return f"ipc://{Path(self.directory) / f'w{worker}.ipc'}"

    def load_table(self) -> np.ndarray | None:
        """The shared load table, mapped: [worker, slot] = (in flight, pending tokens); None
        without slots (no route has replicas)."""
        if not self.slots:
            return None
        return np.memmap(
            os.path.join(self.directory, LOAD_FILE), dtype=np.int64, mode="r+", shape=(self.workers, len(self.slots), 2)
        )

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class WorkerHub:
    """One worker's end of the sharing: its row of the load table, its PUB socket, and the
    subscriber thread that hands the other workers' records to each route's callback."""

    def __init__(self, layout: WorkersLayout, worker: int) -> None:
        if not 0 <= worker < layout.workers:
            raise ValueError(f"worker {worker} outside 0..{layout.workers - 1}")
        self.layout, self.worker = layout, worker
        self.table = layout.load_table()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, SNDHWM)
        self._pub.bind(layout.endpoint(worker))
        self._pub_lock = threading.Lock()  # records come from the loop and from worker threads
        self._apply: dict[str, ApplyRecord] = {}
        self.fleet = SharedFleet(layout.directory, layout.slots)
        self.on_fleet: Callable[[], None] | None = None  # the replica lists changed (any thread may call)
        self._encoder = msgspec.msgpack.Encoder()
        self._stop = threading.Event()
        self._waker = Waker()  # close() wakes the thread out of its poll
        self._thread = threading.Thread(target=self._follow, name="kvgate-peers", daemon=True)
        self._thread.start()
        self.received = 0  # records applied from other workers (tests, logs)

    def state(self, route: str, replicas: Sequence[str]) -> "WorkerState":
        """The StateFactory for a worker's Pipeline: one WorkerState per route."""
        return WorkerState(self, route, {name: self.layout.slots[_slot_key(route, name)] for name in replicas})

    def publish(self, route: str, replica: str, hashes: Sequence[int]) -> None:
        payload = self._encoder.encode((route, replica, list(hashes)))
        with self._pub_lock:
            try:
                self._pub.send(payload, zmq.NOBLOCK)
            except zmq.Again:  # every peer's queue is full: drop, the index is a guess anyway
                pass

    def nudge_fleet(self) -> None:
        """Tell the other workers that the shared replica lists changed."""
        self.publish(FLEET_CHANGED, "", [])

    def _fleet_changed(self) -> None:
        if self.on_fleet is not None:
            try:
                self.on_fleet()
            except Exception:
                log.exception("worker %d: applying the shared replica lists failed", self.worker)

    def _follow(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            for peer in range(self.layout.workers):
                if peer != self.worker:
                    sub.connect(self.layout.endpoint(peer))
            decoder = msgspec.msgpack.Decoder(tuple[str, str, list[int]])
            poller = zmq.Poller()
            poller.register(sub, zmq.POLLIN)
            poller.register(self._waker.fd, zmq.POLLIN)
            token, checked = self.fleet.token(), time.monotonic()
            while not self._stop.is_set():
                if time.monotonic() - checked >= CHECK_S:  # a nudge may have been lost
                    checked = time.monotonic()
                    if (now := self.fleet.token()) != token:
                        token = now
                        self._fleet_changed()
                wait_ms = max(0, int((checked + CHECK_S - time.monotonic()) * 1000))
                if sub not in dict(poller.poll(wait_ms)):
                    continue
                while True:
                    try:
                        payload = sub.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._apply_one(decoder, payload)
        finally:
            sub.close(linger=0)

    def _apply_one(self, decoder: msgspec.msgpack.Decoder, payload: bytes) -> None:
        try:
            route, replica, hashes = decoder.decode(payload)
            if route == FLEET_CHANGED:
                self._fleet_changed()
                return
            apply = self._apply.get(route)
            if apply is not None:
                apply(replica, hashes)
                self.received += 1
        except Exception:  # a bad record must not stop the thread
            log.exception("worker %d: a peer's routing record was not applied", self.worker)

    def close(self) -> None:
        self._stop.set()
        self._waker.wake()
        self._thread.join(1.0)
        if not self._thread.is_alive():
            self._waker.close()
        with self._pub_lock:
            self._pub.close(linger=0)
        self.table = None  # the mapping goes when the last view of it does
        self._ctx.term()


class WorkerState:
    """One route's RoutingState inside one worker (see the module docstring)."""

    shared = True

    def __init__(self, hub: WorkerHub, route: str, slots: dict[str, int]) -> None:
        self._hub, self._route, self._slots = hub, route, slots

    def add_load(self, replica: str, in_flight: int, pending_tokens: int) -> None:
        table = self._hub.table
        if table is not None:
            row = table[self._hub.worker, self._slots[replica]]
            row[0] += in_flight
            row[1] += pending_tokens

    def load(self, replica: str) -> tuple[int, int]:
        table = self._hub.table
        if table is None:
            return 0, 0
        in_flight, pending = table[:, self._slots[replica]].sum(axis=0).tolist()
        return in_flight, pending

    def add_replica(self, replica: str) -> None:
        """A replica added at run time (Router.add_replica): its column from the shared replica
        lists (fleet_workers.py). ValueError: the lists gave it none."""
        slot = self._hub.fleet.slot(self._route, replica)
        if slot is None:
            raise ValueError(f"replica {replica!r} has no load column: add it through the admin API of a worker")
        self._slots[replica] = slot

    def recorded(self, replica: str, hashes: Sequence[int]) -> None:
        self._hub.publish(self._route, replica, hashes)

    def follow(self, apply: ApplyRecord) -> None:
        self._hub._apply[self._route] = apply

    def close(self) -> None:
        pass  # the hub is the worker's, closed once by its owner
