"""KV chunk store: the KV tensors of long prompts in fixed-size chunks keyed by the prefix hash
chain, in RAM, on disk and in a shared Redis (index.chunks.redis, imported where used), so a later
turn, another replica or a restarted replica loads them instead of prefilling again. See store.py for the model, codec.py for the on-disk format."""
from index.chunks.base import BatchTier, StorageTier
from index.chunks.codec import CorruptChunk, KVChunk, decode_chunk, encode_chunk
from index.chunks.disk import DiskTier
from index.chunks.memory import MemoryTier
from index.chunks.store import ChunkStore, chunk_hashes

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
