"""How a ChunkStore turns chunks into bytes and back: the ChunkCodec protocol it encodes and
decodes with, and PairCodec, its default (the (keys, values)-per-layer chunks of codec.py). The
vLLM connector brings its own codec (kvgate.index.kv.chunks.layer_codec)."""

from __future__ import annotations

from typing import Any, Protocol

from kvgate.index.kv.chunks.codec import KVChunk, decode_chunk, encode_chunk


class ChunkCodec(Protocol):
    """Chunk ⇄ bytes under a key. `decode` raises CorruptChunk for bytes `encode` did not make
    under the same key (the store then drops the chunk everywhere and reports a miss).
    `verify=False` says the bytes never left this process (an in-process tier, filled by this
    codec's own `encode`): a codec may then skip the checksum and return read-only views of
    `data`; the framing and the key are still checked."""

    def encode(self, chunk: Any, key: str) -> bytes: ...

    def decode(self, data: bytes | bytearray, key: str, verify: bool = True) -> Any: ...


class PairCodec:
    """The (keys, values)-per-layer chunks of codec.py (the reference replica's)."""

    def encode(self, chunk: KVChunk, key: str) -> bytes:
        return encode_chunk(chunk, key)

    def decode(self, data: bytes | bytearray, key: str, verify: bool = True) -> KVChunk:
        """Always verified and writable: the reference replica's chunks are few and small."""
        return decode_chunk(data, key)
