"""KV cache events: vLLM wire format, EventApplier into our hash space, ZMQ end to end."""

from __future__ import annotations

import logging
from typing import Any, Union

import msgpack
import msgspec
import pytest
import zmq

from kvgate.index.kv.hashing import block_hashes
from kvgate.index.kv.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventApplier,
    EventFeed,
    KVEventBatch,
    ZmqEventPublisher,
    ZmqEventSubscriber,
    decode_batch,
    encode_batch,
    order_of,
)
from kvgate.index.kv.prefix import PrefixIndex
from tests.conftest import wait_until

BS = 16


def toks(n_blocks: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_blocks * BS))


# -- wire format --------------------------------------------------------------------------


def test_roundtrip() -> None:
    batch = KVEventBatch(
        ts=1234.5,
        events=[
            BlockStored([11, 12], None, toks(2), BS, None, "GPU"),
            BlockStored([13], 12, toks(1, 99), BS, 3, "GPU", lora_name="ad", group_idx=1),
            BlockRemoved([11], "GPU"),
            BlockRemoved([b"\x01" * 32], None, group_idx=0),
            AllBlocksCleared(),
        ],
        data_parallel_rank=2,
    )
    assert decode_batch(encode_batch(batch)) == batch
    no_rank = KVEventBatch(ts=1.0, events=[AllBlocksCleared()])
    assert decode_batch(encode_batch(no_rank)) == no_rank


def test_decode_hand_built_vllm_layout() -> None:
    # Built to the layout of vllm/distributed/kv_events.py (msgspec Structs with
    # array_like=True, tag=True, omit_defaults=True, msgpack-encoded):
    #   KVEventBatch  -> [ts, events, data_parallel_rank]
    #   BlockStored   -> ["BlockStored", block_hashes, parent_block_hash, token_ids,
    #                     block_size, lora_id, medium]
    #   BlockRemoved  -> ["BlockRemoved", block_hashes, medium]
    #   AllBlocksCleared -> ["AllBlocksCleared"]
    # Hashes are 64-bit unsigned ints (msgpack uint64).
    big = 2**64 - 1
    payload = msgpack.packb(
        [
            1718000000.25,
            [
                ["BlockStored", [big, 7], None, toks(2), 16, None, "GPU"],
                ["BlockStored", [8], 7, toks(1, 500), 16, None, "GPU"],
                ["BlockRemoved", [7, 8], "GPU"],
                ["AllBlocksCleared"],
            ],
            0,
        ],
        use_bin_type=True,
    )
    b = decode_batch(payload)
    assert b.ts == 1718000000.25 and b.data_parallel_rank == 0
    assert b.events == [
        BlockStored([big, 7], None, toks(2), 16, None, "GPU"),
        BlockStored([8], 7, toks(1, 500), 16, None, "GPU"),
        BlockRemoved([7, 8], "GPU"),
        AllBlocksCleared(),
    ]


def test_decode_older_and_newer_layouts() -> None:
    # Oldest vLLM: [ts, events], BlockStored without medium, BlockRemoved with hashes only.
    old = msgpack.packb([1.0, [["BlockStored", [1], None, toks(1), 16, None], ["BlockRemoved", [1]]]])
    assert decode_batch(old).events == [BlockStored([1], None, toks(1), 16), BlockRemoved([1])]
    # Later releases append lora_name, extra_keys, group_idx, kv_cache_spec_* positionally.
    new = msgpack.packb(
        [1.0, [["BlockStored", [1], None, toks(1), 16, None, "GPU", None, [None], 0, "full_attention"]], 0]
    )
    # The classes mirror vLLM's field order, so those fields are kept too.
    assert decode_batch(new).events == [
        BlockStored(
            [1], None, toks(1), 16, None, "GPU", extra_keys=[None], group_idx=0, kv_cache_spec_kind="full_attention"
        )
    ]
    # Some releases encode events as maps with a "type" tag.
    as_map = msgpack.packb(
        [
            1.0,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [1],
                    "parent_block_hash": None,
                    "token_ids": toks(1),
                    "block_size": 16,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "extra_keys": [None],
                    "group_idx": 0,
                },
                {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"},
            ],
            0,
        ]
    )
    assert decode_batch(as_map).events == [
        BlockStored([1], None, toks(1), 16, None, "GPU", extra_keys=[None], group_idx=0),
        BlockRemoved([1], "GPU"),
    ]
    as_map_batch = msgpack.packb({"ts": 2.0, "events": [["AllBlocksCleared"]]})
    assert decode_batch(as_map_batch) == KVEventBatch(2.0, [AllBlocksCleared()], None)


# vLLM's own classes as its releases define them: array_like up to ~0.11 (lora_id and medium
# required), maps with a "type" tag later (lora_name required too).
class VArrayEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class VArrayStored(VArrayEvent, tag="BlockStored"):
    block_hashes: list[Union[int, bytes]]
    parent_block_hash: Union[int, bytes, None]
    token_ids: list[int]
    block_size: int
    lora_id: Union[int, None]
    medium: Union[str, None]


class VArrayRemoved(VArrayEvent, tag="BlockRemoved"):
    block_hashes: list[Union[int, bytes]]
    medium: Union[str, None]


class VArrayCleared(VArrayEvent, tag="AllBlocksCleared"):
    pass


class VArrayBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Union[VArrayStored, VArrayRemoved, VArrayCleared]]
    data_parallel_rank: Union[int, None] = None


class VMapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class VMapStored(VMapEvent, tag="BlockStored"):
    block_hashes: list[Union[int, bytes]]
    parent_block_hash: Union[int, bytes, None]
    token_ids: list[int]
    block_size: int
    lora_id: Union[int, None]
    medium: Union[str, None]
    lora_name: Union[str, None]
    extra_keys: Union[list[Any], None] = None
    group_idx: Union[int, None] = None


class VMapRemoved(VMapEvent, tag="BlockRemoved"):
    block_hashes: list[Union[int, bytes]]
    medium: Union[str, None]
    group_idx: Union[int, None] = None


class VMapBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Union[VMapStored, VMapRemoved]]
    data_parallel_rank: Union[int, None] = None


def test_vllm_array_decoder_reads_what_we_publish() -> None:
    # medium None too: msgspec writes every field of an array_like Struct, so the fields old
    # vLLM readers require are always there
    ours = KVEventBatch(
        ts=3.5, events=[BlockStored([1, b"h"], None, toks(1), BS), BlockRemoved([1], "GPU"), AllBlocksCleared()]
    )
    theirs = msgspec.msgpack.Decoder(VArrayBatch).decode(encode_batch(ours))
    assert theirs == VArrayBatch(
        3.5, [VArrayStored([1, b"h"], None, toks(1), BS, None, None), VArrayRemoved([1], "GPU"), VArrayCleared()]
    )


def test_we_read_what_vllm_publishes() -> None:
    arr = VArrayBatch(
        1.0,
        [VArrayStored([2**64 - 1], None, toks(1), BS, None, "GPU"), VArrayRemoved([2**64 - 1], "GPU"), VArrayCleared()],
        1,
    )
    assert decode_batch(msgspec.msgpack.encode(arr)) == KVEventBatch(
        1.0,
        [
            BlockStored([2**64 - 1], None, toks(1), BS, None, "GPU"),
            BlockRemoved([2**64 - 1], "GPU"),
            AllBlocksCleared(),
        ],
        1,
    )
    as_map = VMapBatch(2.0, [VMapStored([5], 4, toks(1), BS, None, "GPU", "ad", [None], 1), VMapRemoved([5], "GPU")], 0)
    assert decode_batch(msgspec.msgpack.encode(as_map)) == KVEventBatch(
        2.0, [BlockStored([5], 4, toks(1), BS, None, "GPU", "ad", [None], 1), BlockRemoved([5], "GPU")], 0
    )


def test_bytes_hashes() -> None:
    h1, h2 = bytes(range(32)), bytes(range(1, 33))
    payload = msgpack.packb(
        [
            1.0,
            [
                ["BlockStored", [h1, h2], None, toks(2), 16, None, "GPU"],
                ["BlockStored", [b"x"], h2, toks(1), 16, None, "GPU"],
            ],
        ],
        use_bin_type=True,
    )
    ev = decode_batch(payload).events
    assert ev[0].block_hashes == [h1, h2] and ev[1].parent_block_hash == h2


def test_unknown_tags_skipped_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    payload = msgpack.packb([1.0, [["BlockMoved", 1, 2], ["AllBlocksCleared"], {"type": "BlockMoved"}]])
    seen: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="kvgate.index.kv.kv_events"):
        assert decode_batch(payload, seen).events == [AllBlocksCleared()]
        decode_batch(payload, seen)
    assert seen == {"BlockMoved"}
    assert sum("BlockMoved" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # reserved msgpack byte
        b"\x93\x01",  # array of 3, truncated
        msgpack.packb(42),
        msgpack.packb([1.0]),
        msgpack.packb(["now", []]),
        msgpack.packb([1.0, "events"]),
        msgpack.packb([1.0, [42]]),
        msgpack.packb([1.0, [["BlockStored", [1], None]]]),  # missing fields
        msgpack.packb([1.0, [["BlockStored", [1.5], None, [1], 16, None]]]),
        msgpack.packb([1.0, [["BlockStored", [1], None, "abc", 16, None]]]),
        msgpack.packb([1.0, [["BlockStored", [1], None, [1], 0, None]]]),
        msgpack.packb([1.0, [["BlockStored", [1], "p", [1], 16, None]]]),
        msgpack.packb([1.0, [["BlockRemoved", "1"]]]),
        msgpack.packb([1.0, [{"type": "BlockRemoved"}]]),
        msgpack.packb([1.0, [], "rank"]),
        msgpack.packb([1.0, []]) + b"\x00",  # trailing garbage
    ],
)
def test_malformed_payload_raises_value_error(payload: bytes) -> None:
    with pytest.raises(ValueError):
        decode_batch(payload)


# -- EventApplier ---------------------------------------------------------------------------


def applier(block_size: int = BS, **kw) -> tuple[PrefixIndex, EventApplier]:
    idx = PrefixIndex()
    idx.add_replica("r")
    return idx, EventApplier(idx, "r", block_size, **kw)


def test_applier_root_and_continued_chain() -> None:
    idx, ap = applier()
    t = toks(5)
    ap.apply(BlockStored([101, 102, 103], None, t[: 3 * BS], BS, None, "GPU"))
    assert [ap.our_hash(h) for h in (101, 102, 103)] == block_hashes(t[: 3 * BS], BS)
    ap.apply(BlockStored([104, 105], 103, t[3 * BS :], BS, None, "GPU"))
    ours = block_hashes(t, BS)
    assert [ap.our_hash(h) for h in (101, 102, 103, 104, 105)] == ours
    assert idx.match(ours + block_hashes(t + toks(1, 900), BS)[5:]) == {"r": 5}

    assert not any(idx.forked(h) for h in ours)  # one chain: every block continued one way
    ap.apply(BlockStored([106], 103, toks(1, 900), BS, None, "GPU"))  # another request after block 3
    assert idx.forked(ours[2]) and not idx.forked(ours[1])  # a prefix two continuations share

    ap.apply(BlockRemoved([104, 999], "GPU"))  # 999 unknown: ignored
    assert idx.match(ours) == {"r": 3}
    assert ap.our_hash(104) is None and ap.stats()["mapped"] == 5
    ap.apply(AllBlocksCleared())
    assert idx.match(ours) == {"r": 0} and ap.stats()["mapped"] == 0


def test_applier_extra_and_seed_match_router_hashes() -> None:
    idx, ap = applier(extra=("model-x",), seed="s1")
    t = toks(2)
    ap.apply(BlockStored([1, 2], None, t, BS))
    assert idx.match(block_hashes(t, BS, extra=("model-x",), seed="s1")) == {"r": 2}
    assert idx.match(block_hashes(t, BS)) == {"r": 0}


def test_applier_ignores_wrong_block_size_and_unknown_parent(caplog: pytest.LogCaptureFixture) -> None:
    idx, ap = applier()
    with caplog.at_level(logging.WARNING, logger="kvgate.index.kv.kv_events"):
        ap.apply(BlockStored([1], None, toks(1)[:8], 8))
        ap.apply(BlockStored([2], None, toks(1)[:8], 8))
    assert sum("block_size 8" in r.getMessage() for r in caplog.records) == 1
    ap.apply(BlockStored([3], 77, toks(1), BS))  # parent never seen
    assert idx.blocks("r") == 0
    assert ap.stats()["wrong_block_size"] == 2 and ap.stats()["unknown_parent"] == 1


def test_applier_bytes_engine_hashes() -> None:
    idx, ap = applier()
    t = toks(2)
    ap.apply(BlockStored([b"a" * 32], None, t[:BS], BS))
    ap.apply(BlockStored([b"b" * 32], b"a" * 32, t[BS:], BS))
    assert idx.match(block_hashes(t, BS)) == {"r": 2}
    ap.apply(BlockRemoved([b"a" * 32]))
    assert idx.match(block_hashes(t, BS)) == {"r": 0}


# -- EventFeed ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "last, seq, order",
    [
        (None, None, "next"),
        (None, 7, "next"),
        (3, None, "next"),
        (3, 4, "next"),
        (3, 3, "duplicate"),
        (3, 6, "gap"),
        (3, 0, "restart"),
    ],
)
def test_order_of(last: int | None, seq: int | None, order: str) -> None:
    assert order_of(last, seq) == order


def test_feed_counts_orders_and_measures_lag() -> None:
    idx, ap = applier()
    now = [100.0]
    feed = EventFeed(ap, clock=lambda: now[0], lag_buckets=(0.1, 1.0))
    t = toks(2)
    now[0] = 100.05
    feed.receive(0, encode_batch(KVEventBatch(100.0, [BlockStored([1], None, t[:BS], BS)])))
    now[0] = 102.0
    feed.receive(1, encode_batch(KVEventBatch(100.5, [BlockStored([2], 1, t[BS:], BS), BlockRemoved([9])])))
    feed.receive(1, encode_batch(KVEventBatch(101.0, [AllBlocksCleared()])))  # resend: skipped
    feed.receive(4, b"\xc1")  # 2 and 3 missed; this one undecodable
    now[0] = 99.0  # publisher clock ahead of ours: lag recorded as 0
    feed.receive(5, encode_batch(KVEventBatch(100.0, [])))
    s = feed.stats()
    assert (s.batches, s.events, s.duplicates, s.gaps, s.missed_batches, s.decode_errors) == (3, 3, 1, 1, 2, 1)
    assert s.last_seq == 5 and s.last_lag_s == 0.0 and s.lag_sum_s == pytest.approx(0.05 + 1.5)
    assert s.lag_buckets == ((0.1, 2), (1.0, 2), (float("inf"), 3))
    # the gap (and the undecodable batch after it: one loss, one resync) dropped the replica's view
    assert (s.blocks_stored, s.mapped_blocks, s.resyncs, s.clears) == (2, 0, 1, 1) and idx.blocks("r") == 0
    feed.receive(6, encode_batch(KVEventBatch(100.0, [BlockStored([1], None, t[:BS], BS)])))
    assert idx.blocks("r") == 1  # the view restarts from the events that follow
    feed.receive(0, encode_batch(KVEventBatch(99.0, [])))  # numbering restarted: engine restarted
    s = feed.stats()
    assert s.restarts == 1 and s.clears == 2 and s.resyncs == 1 and idx.blocks("r") == 0


# -- ZMQ end to end ---------------------------------------------------------------------------


def test_publisher_to_subscriber_updates_index() -> None:
    ctx = zmq.Context()
    idx = PrefixIndex()
    idx.add_replica("r")
    ap = EventApplier(idx, "r", BS)
    pub = ZmqEventPublisher("tcp://127.0.0.1:*", context=ctx)
    sub = ZmqEventSubscriber(pub.endpoint, ap, context=ctx).start()
    try:
        t = toks(4)
        ours = block_hashes(t, BS)

        def publish_first() -> bool:
            # Slow joiner: PUB drops messages until the subscription has arrived, so resend
            # until one is applied (storing the same blocks again is idempotent).
            pub.publish([BlockStored([1, 2], None, t[: 2 * BS], BS)])
            return idx.blocks("r") == 2

        assert wait_until(publish_first)
        pub.publish([BlockStored([3, 4], 2, t[2 * BS :], BS), BlockRemoved([4])])
        assert wait_until(lambda: idx.match(ours) == {"r": 3})
        last = pub.publish([AllBlocksCleared()])
        assert wait_until(lambda: idx.blocks("r") == 0)
        s = sub.stats()
        assert s["decode_errors"] == 0 and s["apply_errors"] == 0 and s["gaps"] == 0
        assert s["batches"] >= 3 and s["last_seq"] == last
    finally:
        sub.stop(timeout=10)
        assert sub._thread is not None and not sub._thread.is_alive()  # its poll loop saw the stop
        pub.close()
        ctx.term()


def test_subscriber_counts_gaps_errors_and_two_frame_messages() -> None:
    ctx = zmq.Context()
    idx = PrefixIndex()
    idx.add_replica("r")
    ap = EventApplier(idx, "r", BS)
    raw = ctx.socket(zmq.PUB)
    raw.setsockopt(zmq.LINGER, 0)
    port = raw.bind_to_random_port("tcp://127.0.0.1")
    sub = ZmqEventSubscriber(f"tcp://127.0.0.1:{port}", ap, topic=b"kv", context=ctx).start()
    try:
        t = toks(3)
        stored = encode_batch(KVEventBatch(0.0, [BlockStored([1], None, t[:BS], BS)]))

        def send_first() -> bool:
            raw.send_multipart([b"kv", (0).to_bytes(8, "big"), stored])
            return sub.stats()["batches"] > 0

        assert wait_until(send_first)
        base = sub.stats()["last_seq"]
        assert base == 0
        raw.send_multipart([b"other", (1).to_bytes(8, "big"), stored])  # filtered by topic
        raw.send_multipart(
            [
                b"kv",
                (5).to_bytes(8, "big"),  # seqs 1..4 missed: resync, then apply
                encode_batch(KVEventBatch(0.0, [BlockStored([2], None, t[BS : 2 * BS], BS)])),
            ]
        )
        assert wait_until(lambda: sub.stats()["resyncs"] == 1)
        assert wait_until(lambda: idx.blocks("r") == 1)  # block 1 dropped, block 2 (a new root) kept
        raw.send_multipart([b"kv", (6).to_bytes(8, "big"), b"\xc1garbage"])  # lost too: resync
        raw.send_multipart([b"kv", b"a", b"b", b"c"])  # and again
        raw.send_multipart(
            [
                b"kv",
                encode_batch(  # two-frame message, no seq
                    KVEventBatch(0.0, [BlockStored([3], None, t[2 * BS :], BS)])
                ),
            ]
        )
        assert wait_until(lambda: sub.stats()["decode_errors"] == 2)
        assert wait_until(lambda: idx.blocks("r") == 1 and ap.our_hash(3) is not None)
        s = sub.stats()
        assert s["gaps"] == 1 and s["missed_batches"] == 4 and s["last_seq"] == 6 and s["resyncs"] == 3
        # Sequence going backwards: publisher (engine) restarted, its cache is empty.
        raw.send_multipart([b"kv", (0).to_bytes(8, "big"), stored])
        assert wait_until(lambda: sub.stats()["restarts"] == 1)
        assert wait_until(lambda: idx.blocks("r") == 1)
        dups = sub.stats()["duplicates"]
        raw.send_multipart(
            [b"kv", (0).to_bytes(8, "big"), encode_batch(KVEventBatch(0.0, [AllBlocksCleared()]))]
        )  # same seq again: skipped
        assert wait_until(lambda: sub.stats()["duplicates"] == dups + 1)
        assert idx.blocks("r") == 1
    finally:
        sub.stop()
        raw.close(0)
        ctx.term()
