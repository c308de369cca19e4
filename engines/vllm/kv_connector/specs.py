"""What the scheduler tells the worker each step (which chunks to load into which blocks, which
blocks to save as which chunk), and the worker's counters that travel back in vLLM's stats."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class LoadSpec:
    req_id: str
    hashes: list[int]  # chunk hashes, in order
    block_ids: list[list[int]]  # per chunk, the engine blocks its rows go to
    skip: int  # rows of the first chunk the engine already holds
    background: bool = False  # loaded beside the engine's steps; vLLM waits for get_finished
    salt: str | None = None  # the request's cache_salt: the chunks' key when they are sealed

    def blocks_from(self, chunk: int) -> list[int]:
        """The engine blocks this load writes, from chunk `chunk` on (those it then leaves to recompute)."""
        return [
            b for i, ids in enumerate(self.block_ids[chunk:], start=chunk) for b in ids[(self.skip if i == 0 else 0) :]
        ]


@dataclass
class SaveSpec:
    chunk_hash: int
    block_hashes: list[int]  # every block of the chunk (what the events announce)
    block_ids: list[int]
    salt: str | None = None  # the request's cache_salt: the chunk's key when it is sealed


@dataclass
class Counters:
    loads: int = 0
    loaded_chunks: int = 0
    loaded_bytes: int = 0
    load_s: float = 0.0  # loads on the forward path (host work, then device copies as they complete)
    background_loads: int = 0
    background_load_s: float = 0.0  # loads beside the steps
    load_errors: int = 0  # chunks missing, damaged or misshapen at load time (recomputed)
    saved_chunks: int = 0
    dropped_saves: int = 0
    save_copy_s: float = 0.0  # time on the forward path (the copy out)
    save_write_s: float = 0.0  # time in the background writer
    staging_allocs: int = 0  # host staging buffers allocated (zero once the pool is warm)
    unstaged_copies: int = 0  # chunk groups copied without a staging buffer (the pool was full)
    decrypt_failures: int = 0  # chunks whose seal did not authenticate (read from the store's count)
    gated_loads: int = 0  # scheduler: stored prefixes prefilled because loading them was estimated slower
    prefill_tokens: int = 0  # tokens of the prefill-heavy steps timed for the gate
    prefill_s: float = 0.0
    by_tier: dict[str, list[float]] = field(default_factory=dict)  # tier → [bytes, chunks, seconds] of its loads
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)  # loads on two threads
