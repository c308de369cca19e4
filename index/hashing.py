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
from array import array
from typing import Iterable, Sequence

BlockHash = int  # 64-bit unsigned
DEFAULT_SEED = "kvgate"


def seed_hash(seed: str = DEFAULT_SEED) -> BlockHash:
    """The parent of the first block; routes and replicas must agree on the seed."""
    return int.from_bytes(hashlib.sha256(b"kvgate-seed:" + seed.encode()).digest()[:8], "little")


def _extra_bytes(extra: Sequence[str | int]) -> bytes:
    return "\x1f".join(str(e) for e in extra).encode() if extra else b""


def _extra_prefix(extra: Sequence[str | int]) -> bytes:
    ex = _extra_bytes(extra)
    return len(ex).to_bytes(4, "little") + ex


def hash_block(parent: BlockHash, tokens: Sequence[int], extra: Sequence[str | int] = ()) -> BlockHash:
    """H(parent, extra, tokens). Tokens are packed as uint32 little-endian; extra keys (model,
    LoRA id, …) are length-prefixed so no two (extra, tokens) pairs share an encoding."""
    data = parent.to_bytes(8, "little") + _extra_prefix(extra) + array("I", tokens).tobytes()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


def block_hashes(
    tokens: Sequence[int],
    block_size: int = 16,
    parent: BlockHash | None = None,
    extra: Sequence[str | int] = (),
    seed: str = DEFAULT_SEED,
) -> list[BlockHash]:
    """Hashes of every full block of `tokens`, chained from `parent` (default: the seed).

    Equal to folding hash_block over the blocks; packs the tokens once instead of per block.
    Resuming is exact: block_hashes(a + b) == block_hashes(a) + block_hashes(b, parent=last of a)
    whenever len(a) is a multiple of block_size.
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    h = seed_hash(seed) if parent is None else parent
    n_full = len(tokens) // block_size
    if n_full == 0:
        return []
    packed = array("I", tokens[: n_full * block_size]).tobytes()
    ex = _extra_prefix(extra)
    step = 4 * block_size
    sha, from_bytes = hashlib.sha256, int.from_bytes
    out: list[BlockHash] = []
    for off in range(0, n_full * step, step):
        h = from_bytes(sha(h.to_bytes(8, "little") + ex + packed[off : off + step]).digest()[:8], "little")
        out.append(h)
    return out


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
