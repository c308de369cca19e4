"""KV cache events: vLLM's wire format, applying events to a PrefixIndex, ZMQ transport.

    codec.py      the event classes (msgspec Structs mirroring vLLM's) and encode/decode
    applier.py    EventApplier: events -> PrefixIndex, recomputed in the router's hash space,
                  per medium, bounded with the index
    feed.py       EventFeed: one publisher's batches in order, decoded, applied, counted (lag too);
                  a lost batch (sequence gap, undecodable message) resyncs the replica's view
    transport.py  ZmqEventSubscriber (SUB socket -> EventFeed) and ZmqEventPublisher

A replica (or vLLM) publishes; each router subscribes once per replica in precise mode.
"""

from kvgate.index.kv.kv_events.applier import EventApplier
from kvgate.index.kv.kv_events.codec import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    MEDIUM_REMOTE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineHash,
    EventBatch,
    KVCacheEvent,
    KVEvent,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from kvgate.index.kv.kv_events.feed import LAG_BUCKETS, EventFeed, FeedStats, order_of
from kvgate.index.kv.kv_events.transport import ZmqEventPublisher, ZmqEventSubscriber

__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "MEDIUM_REMOTE",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EngineHash",
    "EventBatch",
    "KVCacheEvent",
    "KVEvent",
    "KVEventBatch",
    "decode_batch",
    "encode_batch",
    "EventApplier",
    "LAG_BUCKETS",
    "EventFeed",
    "FeedStats",
    "order_of",
    "ZmqEventPublisher",
    "ZmqEventSubscriber",
]
