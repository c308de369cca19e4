"""KV cache events: vLLM's wire format, applying events to a PrefixIndex, ZMQ transport.

Wire format (vLLM `vllm/distributed/kv_events.py`, msgspec structs serialized as msgpack):

* ZMQ multipart message ``[topic, seq, payload]``: `seq` is the batch number, 8 bytes
  big-endian, counting from 0 per publisher; `payload` is one msgpack-encoded batch.
* Batch: ``[ts, events]`` or ``[ts, events, data_parallel_rank]`` (msgspec ``array_like``;
  trailing fields equal to their default are omitted). Some releases send it as a map
  ``{"ts": .., "events": .., "data_parallel_rank": ..}``; both are accepted.
* Event: a tagged array, the class name first (msgspec ``tag=True`` + ``array_like``):

  - ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
    medium, lora_name, extra_keys, group_idx, ...]`` (fields from `medium` on were added in
    later releases and may be absent);
  - ``["BlockRemoved", block_hashes, medium, group_idx]`` (`medium`, `group_idx` optional);
  - ``["AllBlocksCleared"]``.

  Newer releases may send an event as a map ``{"type": "BlockStored", "block_hashes": ..}``;
  accepted too. A block hash is an int in most releases and bytes in some; both are kept as is.

`BlockStored.token_ids` are the tokens of the newly stored full blocks only, and
`parent_block_hash` is the engine hash of the block before the first of them (None when the
first new block starts the sequence).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Sequence, Union

import msgpack
import zmq

from index.hashing import DEFAULT_SEED, BlockHash, block_hashes, seed_hash
from index.prefix import PrefixIndex

log = logging.getLogger(__name__)

EngineHash = Union[int, bytes]  # the engine's own block hash, opaque to us
MEDIUM_GPU = "GPU"


# -- decoded events -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: list[EngineHash]
    parent_block_hash: EngineHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    # Later vLLM fields, kept for information; EventApplier does not use them.
    lora_name: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[EngineHash]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    ts: float
    events: list[KVEvent] = field(default_factory=list)
    data_parallel_rank: int | None = None


# -- decoding / encoding --------------------------------------------------------------------


def decode_batch(payload: bytes, unknown_tags: set[str] | None = None) -> KVEventBatch:
    """Decode one msgpack batch in vLLM's format (see the module docstring).

    Events with an unknown tag are skipped. `unknown_tags` holds tags already reported: a new
    one is logged and added, so passing the same set across calls logs each tag once (the
    subscriber does). Raises ValueError on anything that is not a well-formed batch.
    """
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types for truncated/garbage input
        raise ValueError(f"KV event payload is not valid msgpack: {type(e).__name__}: {e}") from e

    if isinstance(obj, dict):
        ts, events, dp_rank = obj.get("ts"), obj.get("events"), obj.get("data_parallel_rank")
    elif isinstance(obj, list) and len(obj) in (2, 3):
        ts, events, dp_rank = obj[0], obj[1], (obj[2] if len(obj) == 3 else None)
    else:
        raise ValueError(f"KV event batch must be [ts, events(, dp_rank)], got {_short(obj)}")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise ValueError(f"KV event batch ts must be a number, got {_short(ts)}")
    if not isinstance(events, list):
        raise ValueError(f"KV event batch events must be a list, got {_short(events)}")
    if dp_rank is not None and not isinstance(dp_rank, int):
        raise ValueError(f"KV event batch data_parallel_rank must be int, got {_short(dp_rank)}")

    seen = unknown_tags if unknown_tags is not None else set()
    decoded: list[KVEvent] = []
    for raw in events:
        ev = _decode_event(raw, seen)
        if ev is not None:
            decoded.append(ev)
    return KVEventBatch(ts=float(ts), events=decoded, data_parallel_rank=dp_rank)


def encode_batch(batch: KVEventBatch) -> bytes:
    """Encode in vLLM's array layout, so one consumer reads vLLM and our replicas alike."""
    out: list[Any] = [batch.ts, [_encode_event(e) for e in batch.events]]
    if batch.data_parallel_rank is not None:
        out.append(batch.data_parallel_rank)
    return msgpack.packb(out, use_bin_type=True)


# Positional layouts after the tag: (name, required). Order is vLLM's field order.
_STORED_FIELDS = (
    ("block_hashes", True), ("parent_block_hash", True), ("token_ids", True),
    ("block_size", True), ("lora_id", False), ("medium", False), ("lora_name", False),
    ("extra_keys", False), ("group_idx", False),
)
_REMOVED_FIELDS = (("block_hashes", True), ("medium", False), ("group_idx", False))
_LAYOUTS: Mapping[str, tuple[tuple[str, bool], ...]] = MappingProxyType(
    {"BlockStored": _STORED_FIELDS, "BlockRemoved": _REMOVED_FIELDS, "AllBlocksCleared": ()}
)


def _decode_event(raw: Any, unknown_tags: set[str]) -> KVEvent | None:
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag, body = raw[0], raw[1:]
        layout = _LAYOUTS.get(tag, ())
        fields = {name: body[i] for i, (name, _) in enumerate(layout) if i < len(body)}
        missing = [n for i, (n, req) in enumerate(layout) if req and i >= len(body)]
    elif isinstance(raw, dict) and isinstance(raw.get("type"), str):
        tag, fields = raw["type"], raw
        layout = _LAYOUTS.get(tag, ())
        missing = [n for n, req in layout if req and n not in raw]
    else:
        raise ValueError(f"KV event must be a tagged array or map, got {_short(raw)}")

    if tag not in _LAYOUTS:
        if tag not in unknown_tags:
            unknown_tags.add(tag)
            log.warning("skipping KV events with unknown tag %r", tag)
        return None
    if missing:
        raise ValueError(f"{tag} event lacks {', '.join(missing)}: {_short(raw)}")
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()

    hashes = _hash_list(fields["block_hashes"], tag)
    medium = _opt(fields.get("medium"), str, "medium")
    group_idx = _opt(fields.get("group_idx"), int, "group_idx")
    if tag == "BlockRemoved":
        return BlockRemoved(block_hashes=hashes, medium=medium, group_idx=group_idx)

    parent = fields["parent_block_hash"]
    if parent is not None and not _is_hash(parent):
        raise ValueError(f"BlockStored parent_block_hash must be int, bytes or None: {parent!r}")
    tokens = fields["token_ids"]
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise ValueError(f"BlockStored token_ids must be a list of ints: {_short(tokens)}")
    block_size = fields["block_size"]
    if type(block_size) is not int or block_size <= 0:
        raise ValueError(f"BlockStored block_size must be a positive int: {block_size!r}")
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=block_size,
        lora_id=_opt(fields.get("lora_id"), int, "lora_id"),
        medium=medium,
        lora_name=_opt(fields.get("lora_name"), str, "lora_name"),
        group_idx=group_idx,
    )


def _encode_event(ev: KVEvent) -> list[Any]:
    if isinstance(ev, BlockStored):
        out = ["BlockStored", ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size,
               ev.lora_id, ev.medium]
        if ev.lora_name is not None or ev.group_idx is not None:
            out += [ev.lora_name, None]  # extra_keys: we have none to publish
        if ev.group_idx is not None:
            out.append(ev.group_idx)
        return out
    if isinstance(ev, BlockRemoved):
        out = ["BlockRemoved", ev.block_hashes, ev.medium]
        if ev.group_idx is not None:
            out.append(ev.group_idx)
        return out
    if isinstance(ev, AllBlocksCleared):
        return ["AllBlocksCleared"]
    raise TypeError(f"not a KV event: {ev!r}")


def _is_hash(h: Any) -> bool:
    return (type(h) is int) or isinstance(h, bytes)


def _hash_list(v: Any, tag: str) -> list[EngineHash]:
    if not isinstance(v, list) or not all(_is_hash(h) for h in v):
        raise ValueError(f"{tag} block_hashes must be a list of int or bytes: {_short(v)}")
    return v


def _opt(v: Any, typ: type, name: str) -> Any:
    if v is not None and (not isinstance(v, typ) or isinstance(v, bool)):
        raise ValueError(f"event field {name} must be {typ.__name__} or None, got {v!r}")
    return v


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 120 else r[:117] + "..."


# -- applying events to the index -----------------------------------------------------------


class EventApplier:
    """Applies one replica's engine events to a PrefixIndex, in OUR hash space.

    The engine's block hashes use its own function and seed, so they are not comparable with
    the hashes the router computes. For BlockStored we recompute ours from the event's
    token_ids, chained from our hash of the event's parent block (looked up in a per-replica
    map engine hash -> our hash, filled by earlier BlockStored events), or from our seed when
    the parent is None. Because both hash chains cover the same token prefixes, the mapping is
    one-to-one along a chain.

    Ignored, and counted in `stats()`:
    * events whose block_size differs from ours (their blocks cut the tokens at other
      boundaries, so no hash of ours corresponds to them; logged once per size);
    * BlockStored whose parent we never saw (e.g. we subscribed after the engine stored it):
      without our parent hash the chain cannot be continued.
    BlockRemoved of unknown engine hashes is a no-op. The map is kept bounded by dropping
    entries on BlockRemoved and AllBlocksCleared (a lost removal event leaves one entry behind).

    Not thread-safe by itself: one applier is driven by one subscriber thread.
    """

    def __init__(
        self,
        index: PrefixIndex,
        replica: str,
        block_size: int,
        extra: Sequence[str | int] = (),
        seed: str = DEFAULT_SEED,
    ) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.index = index
        self.replica = replica
        self.block_size = block_size
        self.extra = tuple(extra)
        self.seed = seed
        self._root = seed_hash(seed)
        self._ours: dict[EngineHash, BlockHash] = {}
        self._bad_sizes: set[int] = set()
        self._counts = {"stored": 0, "removed": 0, "cleared": 0, "wrong_block_size": 0,
                        "unknown_parent": 0}

    def apply_batch(self, batch: KVEventBatch) -> None:
        for ev in batch.events:
            self.apply(ev)

    def apply(self, event: KVEvent) -> None:
        if isinstance(event, BlockStored):
            self._stored(event)
        elif isinstance(event, BlockRemoved):
            ours = [self._ours.pop(h) for h in event.block_hashes if h in self._ours]
            self.index.removed(self.replica, ours)
            self._counts["removed"] += len(ours)
        elif isinstance(event, AllBlocksCleared):
            self.reset()
        else:
            raise TypeError(f"not a KV event: {event!r}")

    def reset(self) -> None:
        """Forget everything this replica holds (cache cleared or engine restarted)."""
        self.index.cleared(self.replica)
        self._ours.clear()
        self._counts["cleared"] += 1

    def our_hash(self, engine_hash: EngineHash) -> BlockHash | None:
        """Our hash for an engine block hash, if that block is known to be stored."""
        return self._ours.get(engine_hash)

    def stats(self) -> dict[str, int]:
        return {**self._counts, "mapped": len(self._ours)}

    def _stored(self, ev: BlockStored) -> None:
        if ev.block_size != self.block_size:
            self._counts["wrong_block_size"] += 1
            if ev.block_size not in self._bad_sizes:
                self._bad_sizes.add(ev.block_size)
                log.warning("replica %s: ignoring KV events with block_size %d (ours is %d)",
                            self.replica, ev.block_size, self.block_size)
            return
        if ev.parent_block_hash is None:
            parent = self._root
        else:
            found = self._ours.get(ev.parent_block_hash)
            if found is None:
                self._counts["unknown_parent"] += 1
                log.debug("replica %s: BlockStored with unknown parent, skipped", self.replica)
                return
            parent = found
        ours = block_hashes(ev.token_ids, self.block_size, parent=parent, extra=self.extra,
                            seed=self.seed)
        if len(ours) != len(ev.block_hashes):
            # Should not happen with vLLM (token_ids are exactly the new full blocks); keep
            # the blocks both sides agree on.
            log.warning("replica %s: BlockStored has %d hashes but %d full blocks of tokens",
                        self.replica, len(ev.block_hashes), len(ours))
            ours = ours[: len(ev.block_hashes)]
        for engine_h, our_h in zip(ev.block_hashes, ours):
            self._ours[engine_h] = our_h
        self.index.stored(self.replica, ours)
        self._counts["stored"] += len(ours)


# -- ZMQ transport --------------------------------------------------------------------------


class ZmqEventSubscriber:
    """SUB socket on a daemon thread: receives batches, decodes them, applies them.

    Accepts ``[topic, seq, payload]`` (vLLM) and ``[topic, payload]`` messages. Counts batches,
    events, decode errors, apply errors and sequence gaps (missed batches: the index may then
    be stale until the engine stores/evicts those blocks again). A batch repeating the last
    sequence number is a duplicate and skipped. A sequence number going backwards means the
    publisher restarted; a restarted engine has an empty cache, so the replica's blocks are
    cleared before the batch is applied.
    """

    POLL_MS = 100  # stop() latency bound

    def __init__(
        self,
        endpoint: str,
        applier: EventApplier,
        topic: bytes = b"",
        context: zmq.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.applier = applier
        self.topic = topic
        self._ctx = context or zmq.Context.instance()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards _stats (read from other threads)
        self._stats = {"batches": 0, "events": 0, "decode_errors": 0, "apply_errors": 0,
                       "gaps": 0, "missed_batches": 0, "duplicates": 0, "restarts": 0}
        self._last_seq: int | None = None

    def start(self) -> "ZmqEventSubscriber":
        """Start the thread; returns once the socket is connected and subscribed."""
        if self._thread is not None:
            raise RuntimeError("subscriber already started")
        self._thread = threading.Thread(target=self._run, name=f"kv-events-{self.applier.replica}",
                                        daemon=True)
        self._thread.start()
        self._ready.wait(5.0)
        return self

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def stats(self) -> dict[str, int | None]:
        with self._lock:
            return {**self._stats, "last_seq": self._last_seq}

    def _run(self) -> None:
        sock = self._ctx.socket(zmq.SUB)  # sockets are single-thread: create it here
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, self.topic)
            sock.connect(self.endpoint)
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            self._ready.set()
            unknown: set[str] = set()
            while not self._stop.is_set():
                if not poller.poll(self.POLL_MS):
                    continue
                while True:  # drain what is queued before polling again
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._handle(frames, unknown)
        finally:
            self._ready.set()
            sock.close(linger=0)

    def _handle(self, frames: list[bytes], unknown: set[str]) -> None:
        if len(frames) == 3:
            seq: int | None = int.from_bytes(frames[1], "big", signed=True)
            payload = frames[2]
        elif len(frames) == 2:
            seq, payload = None, frames[1]
        else:
            self._count("decode_errors")
            log.warning("KV event message with %d frames ignored", len(frames))
            return
        order = self._track_seq(seq)
        if order == "duplicate":
            return
        try:
            batch = decode_batch(payload, unknown)
        except ValueError as e:
            self._count("decode_errors")
            log.warning("bad KV event batch from %s: %s", self.endpoint, e)
            return
        try:
            if order == "restart":
                self.applier.reset()
            self.applier.apply_batch(batch)
        except Exception:  # keep consuming; one bad batch must not kill the thread
            self._count("apply_errors")
            log.exception("applying KV events from %s failed", self.endpoint)
            return
        with self._lock:
            self._stats["batches"] += 1
            self._stats["events"] += len(batch.events)

    def _count(self, key: str) -> None:
        with self._lock:
            self._stats[key] += 1

    def _track_seq(self, seq: int | None) -> str:
        """'next', 'gap' (batches missed), 'duplicate' (seq seen last: skip it) or 'restart'
        (seq went backwards: a new publisher, i.e. a restarted engine)."""
        if seq is None:
            return "next"
        with self._lock:
            last = self._last_seq
            if last is not None and seq == last:
                self._stats["duplicates"] += 1
                return "duplicate"
            self._last_seq = seq
            if last is None or seq == last + 1:
                return "next"
            if seq > last + 1:
                self._stats["gaps"] += 1
                self._stats["missed_batches"] += seq - last - 1
                return "gap"
            self._stats["restarts"] += 1
            return "restart"


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
        batch = KVEventBatch(ts=time.time(), events=list(events),
                             data_parallel_rank=self.data_parallel_rank)
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
