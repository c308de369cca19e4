"""Which tiers of a ChunkStore hold sealed chunks, and the sealing and opening of one chunk for a tier.

With a cipher (kvgate.index.storage.cipher.ChunkCipher), every tier whose bytes leave the engine
process (a disk directory, a shared Redis) holds chunks sealed with AES-GCM under the key of the
request's cache_salt; a tier that marks itself `in_process` (MemoryTier: the engine's own RAM, like
the KV cache itself) holds them as the codec made them. Without a cipher nothing is sealed and the
bytes are the codec's, exactly as before encryption existed.

Invariants: a chunk is sealed at most once per write or read (a sealed value is valid as it is in
every sealed tier: its store key and salt, not the tier, make it); a load costs one AES-GCM pass
and no copy (DiskTier's fresh buffers are opened in place); an opening that fails raises
CorruptChunk, so ChunkStore drops the chunk everywhere and reports a miss, and is counted.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from kvgate.index.kv.chunks.codec import CorruptChunk
from kvgate.index.storage.cipher import AuthFailed, ChunkCipher


class TierSealing:
    def __init__(self, tiers: Sequence[Any], cipher: ChunkCipher | None) -> None:
        self.cipher = cipher
        self.sealed = {t.name for t in tiers if not getattr(t, "in_process", False)} if cipher is not None else set()
        self._lock = threading.Lock()
        self.auth_failures = 0  # reads whose seal did not authenticate (tampered, another key or salt, unsealed)

    def open(self, tier: str, data: bytes, key: str, salt: str | None) -> bytes:
        """What the codec reads of `data` as read from `tier`: opened where sealed (a bytearray in
        place: it is then the plaintext, and no longer the sealed value)."""
        if tier not in self.sealed:
            return data
        try:
            return self.cipher.open(data, key, salt)  # type: ignore[union-attr]
        except AuthFailed as e:
            with self._lock:
                self.auth_failures += 1
            raise CorruptChunk(str(e)) from None

    def stored_as(self, tier: str, key: str, plain: bytes, sealed: bytes | None, salt: str | None) -> bytes:
        """The bytes `tier` holds of a chunk: `sealed` if given (or sealed now) where sealing applies."""
        if tier not in self.sealed:
            return plain
        return sealed if sealed is not None else self.cipher.seal(plain, key, salt)  # type: ignore[union-attr]
