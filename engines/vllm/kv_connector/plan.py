"""The scheduler's arithmetic, as pure functions: which chunks a request can load, which it saves.

Terms. A block is the engine's (block_size tokens; its hash is the engine's own, chained over
every earlier token and the request's extra keys: LoRA, cache_salt, multimodal inputs). A chunk is
`chunk_blocks` consecutive blocks, c = 0, 1, ..., stored under the hash of its LAST block, so a
chunk is found only after exactly the same prefix up to its end (and only for the same tenant salt
and LoRA, which the engine's hash carries).

Invariants:
* a load never covers the prompt's last token (the engine must compute at least one), never ends
  inside a chunk, and starts at the chunk holding the first block the engine lacks;
* a save covers only chunks whose every block's KV has been computed and whose last block has a
  hash (a full block).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

LOW64 = (1 << 64) - 1


def low64(block_hash: bytes | int) -> int:
    """The engine's hash as the int its KV events carry (low 64 bits, big-endian bytes)."""
    if isinstance(block_hash, int):
        return block_hash & LOW64
    return int.from_bytes(block_hash, "big") & LOW64


@dataclass(frozen=True)
class LoadPlan:
    first_chunk: int  # chunk index of the first chunk to read
    n_chunks: int
    skip_blocks: int  # blocks of the first chunk the engine already has (not overwritten)
    tokens: int  # tokens this load adds beyond what the engine computed


def chunk_ends(n_hashes: int, chunk_blocks: int) -> list[int]:
    """Block index of each full chunk's last block."""
    return [(c + 1) * chunk_blocks - 1 for c in range(n_hashes // chunk_blocks)]


def plan_load(
    hashes: Sequence[int],
    num_tokens: int,
    num_computed: int,
    block_size: int,
    chunk_blocks: int,
    longest_prefix: Callable[[list[int]], int],
) -> LoadPlan | None:
    """What to load for a request with `num_tokens` tokens of which the engine has `num_computed`
    (block-aligned), given its full blocks' `hashes`; `longest_prefix(chunk_hashes)` counts the
    leading chunks a tier holds. None when nothing beyond the engine's own cache is stored."""
    usable = min(len(hashes), max(0, num_tokens - 1) // block_size)  # leave one token to compute
    computed_blocks = num_computed // block_size
    first = computed_blocks // chunk_blocks
    ends = chunk_ends(usable, chunk_blocks)[first:]
    if not ends:
        return None
    found = longest_prefix([hashes[e] for e in ends])
    end_block = (first + found) * chunk_blocks
    if end_block <= computed_blocks:
        return None
    return LoadPlan(first, found, computed_blocks - first * chunk_blocks, end_block * block_size - num_computed)


def chunks_to_save(saved_upto: int, computed_tokens: int, n_hashes: int, block_size: int, chunk_blocks: int) -> range:
    """Chunk indices that became complete: from `saved_upto` (the first chunk not yet saved or
    known stored) to the last chunk whose blocks are all computed and hashed."""
    full = min(computed_tokens // block_size, n_hashes) // chunk_blocks
    return range(saved_upto, max(saved_upto, full))
