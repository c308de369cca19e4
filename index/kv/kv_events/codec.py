"""vLLM's KV cache events as msgspec Structs, and their msgpack wire format.

The classes mirror `vllm/distributed/kv_events.py` field for field and in vLLM's order, so a
msgspec decoder built on either side reads the other's bytes:

* `KVEventBatch`: ``[ts, events, data_parallel_rank]`` (``array_like``);
* an event is a tagged array, the class name first (``tag=True`` + ``array_like``):
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  lora_name, extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window]``,
  ``["BlockRemoved", block_hashes, medium, group_idx]``, ``["AllBlocksCleared"]``.

msgspec writes every field of an ``array_like`` Struct (``omit_defaults`` only shortens maps),
so what we publish always carries the fields older vLLM consumers require (`lora_id`,
`medium`); readers ignore trailing fields they do not know. When decoding, fields that older
releases did not send yet (`medium`, `lora_name`, ...) default to None.

Some vLLM releases send the batch and/or the events as maps (``{"ts": .., "events": ..}``,
``{"type": "BlockStored", "block_hashes": ..}``); those are read too (the slow path below).
A block hash is an int in most releases and bytes in some; both are kept as they are.

`BlockStored.token_ids` are the tokens of the newly stored full blocks only, and
`parent_block_hash` is the engine hash of the block before the first of them (None when the
first new block starts the sequence).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Union

import msgspec

log = logging.getLogger(__name__)

EngineHash = Union[int, bytes]  # vLLM's ExternalBlockHash: the engine's own hash, opaque to us
# `medium` values: vLLM's block pool says "GPU" (its own prefix cache, whatever the device);
# offloading connectors name their tier ("CPU", ...). The reference replica says "CPU" for its
# chunk store as a whole (RAM, then disk), and "REMOTE" for chunks it can load only from its
# remote tier (a Redis other replicas share): see engines/replica/announce.py.
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_REMOTE = "REMOTE"


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, frozen=True):
    """One publish: events in engine order, stamped with the engine's wall clock (`ts`)."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True, frozen=True):
    """Base of the KV cache events; the tag is the class name."""


class BlockStored(KVCacheEvent):
    block_hashes: list[EngineHash]
    parent_block_hash: EngineHash | None
    token_ids: list[int]
    block_size: Annotated[int, msgspec.Meta(gt=0)]
    lora_id: int | None = None
    medium: str | None = None
    # Later vLLM fields, kept for information; EventApplier does not use them.
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[EngineHash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


KVEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


class KVEventBatch(EventBatch):
    events: list[KVEvent]


# Map layouts of the same classes (newer vLLM releases); decoded, then turned into the above.
class _MapBatch(EventBatch, array_like=False):
    pass


class _MapBlockStored(BlockStored, array_like=False, tag="BlockStored"):
    pass


class _MapBlockRemoved(BlockRemoved, array_like=False, tag="BlockRemoved"):
    pass


class _MapAllBlocksCleared(AllBlocksCleared, array_like=False, tag="AllBlocksCleared"):
    pass


_EVENT_FORMS: dict[str, tuple[type[KVCacheEvent], type[KVCacheEvent]]] = {
    "BlockStored": (BlockStored, _MapBlockStored),
    "BlockRemoved": (BlockRemoved, _MapBlockRemoved),
    "AllBlocksCleared": (AllBlocksCleared, _MapAllBlocksCleared),
}
# msgspec encoders and decoders hold no per-call state: safe to share between threads.
_BATCH_DECODER = msgspec.msgpack.Decoder(KVEventBatch)
_ANY_DECODER = msgspec.msgpack.Decoder()
_ENCODER = msgspec.msgpack.Encoder()


def encode_batch(batch: KVEventBatch) -> bytes:
    """Encode in vLLM's array layout, so one consumer reads vLLM and our replicas alike."""
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes, unknown_tags: set[str] | None = None) -> KVEventBatch:
    """Decode one msgpack batch in vLLM's format (see the module docstring).

    Invariant: the result holds only the three known event classes, in their array form, so
    two batches compare equal whatever layout they arrived in. Events with an unknown tag are
    skipped; `unknown_tags` holds tags already reported: a new one is logged and added, so
    passing the same set across calls logs each tag once (the subscriber does). Raises
    ValueError on anything that is not a well-formed batch.
    """
    try:
        return _BATCH_DECODER.decode(payload)  # the common case: vLLM's array layout, known tags
    except msgspec.DecodeError:  # also ValidationError; map layouts and unknown tags land here
        pass
    try:
        obj = _ANY_DECODER.decode(payload)
    except msgspec.DecodeError as e:
        raise ValueError(f"KV event payload is not valid msgpack: {e}") from e
    form = _MapBatch if isinstance(obj, dict) else EventBatch
    try:
        raw = msgspec.convert(obj, form)
    except msgspec.ValidationError as e:
        raise ValueError(f"not a KV event batch ([ts, events(, dp_rank)]): {e}: {_short(obj)}") from e
    seen = unknown_tags if unknown_tags is not None else set()
    events = [ev for ev in (_decode_event(item, seen) for item in raw.events) if ev is not None]
    return KVEventBatch(ts=raw.ts, events=events, data_parallel_rank=raw.data_parallel_rank)


def _decode_event(item: Any, unknown_tags: set[str]) -> KVEvent | None:
    """One decoded event of either layout, None for an unknown tag (logged once per tag)."""
    if isinstance(item, list) and item and isinstance(item[0], str):
        tag, as_map = item[0], False
    elif isinstance(item, dict) and isinstance(item.get("type"), str):
        tag, as_map = item["type"], True
    else:
        raise ValueError(f"KV event must be a tagged array or map, got {_short(item)}")
    forms = _EVENT_FORMS.get(tag)
    if forms is None:
        if tag not in unknown_tags:
            unknown_tags.add(tag)
            log.warning("skipping KV events with unknown tag %r", tag)
        return None
    array_cls, map_cls = forms
    try:
        ev = msgspec.convert(item, map_cls if as_map else array_cls)
    except msgspec.ValidationError as e:
        raise ValueError(f"bad {tag} event: {e}: {_short(item)}") from e
    # a map-form instance is a subclass; equality and isinstance users want the array class
    return ev if type(ev) is array_cls else array_cls(**msgspec.structs.asdict(ev))  # type: ignore[return-value]


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 120 else r[:117] + "..."
