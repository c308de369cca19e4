"""BlockCounts: how many chains hold each block, for a view whose blocks stay while any chain
still holds them (precise mode's prefixes in flight: kvgate.middleware.routing.inflight).

A long prompt at small blocks is thousands of blocks, each counted up when its request is sent
and down when it is done, so the counting runs in the prefix index's C loops, over the C module's
own table (hashes inline), where they are built; otherwise in Python over a dict.

May import: kvgate.index.kv.prefix_loops, kvgate.index.kv.hashing (the BlockHash type).
"""

from __future__ import annotations

from types import ModuleType
from typing import Sequence

from kvgate.index.kv.hashing import BlockHash
from kvgate.index.kv.prefix_loops import loops


class BlockCounts:
    """block → how many chains counted in hold it; a block no chain holds is absent.
    Not thread-safe: the caller serializes its calls."""

    def __init__(self, chain_loops: ModuleType | None = None) -> None:
        self._loops = chain_loops if chain_loops is not None else loops()
        table = getattr(self._loops, "U64Map", None)
        self._counts = table() if table is not None else {}

    def add(self, hashes: Sequence[BlockHash]) -> None:
        """One more chain holds these blocks."""
        self._loops.tally(self._counts, hashes, True)

    def drop(self, hashes: Sequence[BlockHash]) -> list[BlockHash]:
        """One chain fewer holds these blocks: the ones no chain holds any more, in order."""
        return self._loops.tally(self._counts, hashes, False)

    def __len__(self) -> int:
        return len(self._counts)

    def __contains__(self, h: BlockHash) -> bool:
        return h in self._counts
