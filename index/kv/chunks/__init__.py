"""KV chunk store: the KV tensors of long prompts in fixed-size chunks keyed by the prefix hash
chain, in RAM, on disk and in a shared Redis (kvgate.index.kv.chunks.redis, imported where used), so a later
turn, another replica or a restarted replica loads them instead of prefilling again. See store.py for the model, codec.py for the on-disk format."""

from kvgate.index.kv.chunks.base import BatchTier, StorageTier
from kvgate.index.kv.chunks.codec import CorruptChunk, KVChunk, decode_chunk, encode_chunk
from kvgate.index.kv.chunks.disk import DiskTier
from kvgate.index.kv.chunks.memory import MemoryTier
from kvgate.index.kv.chunks.store import ChunkStore, chunk_hashes

__all__ = [
    "BatchTier",
    "ChunkStore",
    "CorruptChunk",
    "DiskTier",
    "KVChunk",
    "MemoryTier",
    "StorageTier",
    "chunk_hashes",
    "decode_chunk",
    "encode_chunk",
]
