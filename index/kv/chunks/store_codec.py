"""How a ChunkStore turns chunks into bytes and back: the ChunkCodec protocol it encodes and
decodes with, and PairCodec, its default (the (keys, values)-per-layer chunks of codec.py). The
vLLM connector brings its own codec (kvgate.index.kv.chunks.layer_codec)."""

from __future__ import annotations

from typing import Any, Protocol

from kvgate.index.kv.chunks.codec import KVChunk, decode_chunk, encode_chunk


class ChunkCodec(Protocol):
    """Chunk ⇄ bytes under a key. `decode` raises CorruptChunk for bytes `encode` did not make
    under the same key (the store then drops the chunk everywhere and reports a miss)."""

    def encode(self, chunk: Any, key: str) -> bytes: ...

    def decode(self, data: bytes | bytearray, key: str) -> Any: ...


class PairCodec:
    """The (keys, values)-per-layer chunks of codec.py (the reference replica's)."""

    def encode(self, chunk: KVChunk, key: str) -> bytes:
        return encode_chunk(chunk, key)

    def decode(self, data: bytes | bytearray, key: str) -> KVChunk:
        return decode_chunk(data, key)
