"""Chained block hashes over token ids (the vLLM prefix-caching scheme), pure functions.

A prompt of tokens t_0..t_{n-1} is cut into full blocks of `block_size` tokens (the partial tail
is not hashed: an engine caches only full blocks). Block i's hash is

    h_i = H(h_{i-1} || extra || tokens of block i),   h_{-1} = seed_hash(seed)

with H = SHA-256, truncated to 64 bits for compact keys. Because every hash covers its parent,
h_i depends on *all* tokens before the end of block i: two prompts share h_0..h_k exactly when
(up to SHA-256 collisions) they share their first (k+1)·block_size tokens. So "the longest run of
leading hashes a replica holds" is "the longest cached token prefix", and matching is a walk from
the front that stops at the first miss. Same input gives the same hashes in every process and on
every machine (no Python `hash()`, no pickling).
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from typing import Iterable, Sequence

from kvgate.index.kv.hash_loops import loops

BlockHash = int  # 64-bit unsigned
DEFAULT_SEED = "kvgate"
_BIG_ENDIAN = sys.byteorder == "big"


def seed_hash(seed: str = DEFAULT_SEED) -> BlockHash:
    """The parent of the first block; routes and replicas must agree on the seed."""
    return int.from_bytes(hashlib.sha256(b"kvgate-seed:" + seed.encode()).digest()[:8], "little")


def salted_seed(seed: str, salt: str | None) -> str:
    """The seed of a salted chain: an engine keys a salted request's first block by its salt
    too, so a salted prompt and an unsalted one (or two salts) share no block. Here the salt
    moves the chain's root instead, with the same effect: no common prefix across salts."""
    return seed if not salt else f"{seed}\x00salt\x00{salt}"


def _extra_bytes(extra: Sequence[str | int]) -> bytes:
    return "\x1f".join(str(e) for e in extra).encode() if extra else b""


def extra_prefix(extra: Sequence[str | int]) -> bytes:
    """The extra keys as every block's hash input carries them (after the parent): length-prefixed."""
    ex = _extra_bytes(extra)
    return len(ex).to_bytes(4, "little") + ex


def hash_block(parent: BlockHash, tokens: Sequence[int], extra: Sequence[str | int] = ()) -> BlockHash:
    """H(parent, extra, tokens). Tokens are packed as uint32 little-endian; extra keys (model,
    LoRA id, …) are length-prefixed so no two (extra, tokens) pairs share an encoding."""
    data = parent.to_bytes(8, "little") + extra_prefix(extra) + pack_tokens(tokens)
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """Token ids as the hashes read them: uint32 little-endian, 4 bytes each."""
    packed = array("I", tokens)
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def _unpack(code: str, packed: bytes) -> list[int]:
    """Little-endian unsigned ints of array type `code` ("I": 4 bytes, "Q": 8), end to end."""
    values = array(code)
    values.frombytes(packed)
    if _BIG_ENDIAN:
        values.byteswap()
    return values.tolist()


def unpack_tokens(packed: bytes) -> list[int]:
    """The inverse of pack_tokens."""
    return _unpack("I", packed)


def block_hashes(
    tokens: Sequence[int],
    block_size: int = 16,
    parent: BlockHash | None = None,
    extra: Sequence[str | int] = (),
    seed: str = DEFAULT_SEED,
) -> list[BlockHash]:
    """Hashes of every full block of `tokens`, chained from `parent` (default: the seed).

    Equal to folding hash_block over the blocks. Resuming is exact:
    block_hashes(a + b) == block_hashes(a) + block_hashes(b, parent=last of a)
    whenever len(a) is a multiple of block_size.
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    n_full = len(tokens) // block_size
    packed = pack_tokens(tokens[: n_full * block_size]) if n_full else b""
    return digests_to_hashes(packed_block_digests(packed, block_size, parent, extra, seed))


def packed_block_digests(
    packed: bytes | memoryview,
    block_size: int,
    parent: BlockHash | bytes | None = None,
    extra: Sequence[str | int] = (),
    seed: str = DEFAULT_SEED,
) -> bytes:
    """block_hashes over tokens already packed (pack_tokens), as their 8-byte little-endian
    digests end to end: digest i = the bytes of hash i. The partial tail is not hashed.

    `parent` is a hash or its 8-byte digest. Invariant:
    digests_to_hashes(packed_block_digests(pack_tokens(t), b, p)) == block_hashes(t, b, p).
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    if parent is None:
        parent = seed_hash(seed)
    h = parent if isinstance(parent, bytes) else parent.to_bytes(8, "little")
    return chain_digests(packed, 4 * block_size, h, extra_prefix(extra))


# packed_block_digests' loop for a caller that keeps its settings encoded (`step` = 4 × block_size
# bytes per block, `parent` the 8-byte digest before the first block, `prefix` = extra_prefix(extra)):
# in C where the extension was built (kvgate.index.kv.hash_loops)
chain_digests = loops().chain_digests


def digests_to_hashes(digests: bytes) -> list[BlockHash]:
    """8-byte little-endian digests end to end → their hashes as ints."""
    return _unpack("Q", digests)


def text_tokens(text: str) -> list[int]:
    """Fallback "tokens" for routes without a tokenizer: the text's Unicode code points."""
    return [ord(c) for c in text]


def common_prefix_len(a: Iterable[BlockHash], b: Iterable[BlockHash]) -> int:
    """Number of leading hashes two chains share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
