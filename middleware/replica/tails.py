"""The KV of the partial chunk after a conversation's last full chunk, kept in RAM.

The chunk store holds only full chunks, so without this every later turn re-prefills up to
chunk_tokens − 1 tokens of history (the tail of the previous prompt + the previous answer) before
its own new tokens: ~180 tokens, 0.5 s on 2 CPU cores for SmolLM2, most of a warm turn's TTFT.

Invariant: a tail is stored under the chained hash of the full chunk before it (None at the
start), which covers every earlier token, and carries its own token ids; it is reused only for a
prompt whose tokens after those full chunks begin with (a prefix of) the tail's tokens. Keys are
after RoPE, so a tail is valid exactly at the absolute position it was computed at — which is
where it is used, right after the same full chunks.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch

from index.hashing import common_prefix_len

TAILS_PER_PARENT = 4  # distinct continuations of one prefix kept at once


@dataclass(frozen=True)
class Tail:
    tokens: tuple[int, ...]
    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer (keys, values) [1, heads, t, d]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


class TailCache:
    """LRU of tails under a byte budget; thread-safe."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._tails: OrderedDict[tuple[int | None, tuple[int, ...]], Tail] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0

    def put(self, parent: int | None, tail: Tail) -> None:
        if not tail.tokens or tail.nbytes > self.budget_bytes:
            return
        key = (parent, tail.tokens)
        with self._lock:
            old = self._tails.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            siblings = [k for k in self._tails if k[0] == parent]
            for k in siblings[: max(0, len(siblings) - TAILS_PER_PARENT + 1)]:
                self._bytes -= self._tails.pop(k).nbytes
            self._tails[key] = tail
            self._bytes += tail.nbytes
            while self._bytes > self.budget_bytes:
                self._bytes -= self._tails.popitem(last=False)[1].nbytes

    def best(self, parent: int | None, rest: Sequence[int], limit: int) -> Tail | None:
        """The stored tail after `parent` sharing the longest prefix with `rest`, cut to at most
        `limit` tokens (a prefix of a tail's KV is the KV of that prefix: attention is causal)."""
        with self._lock:
            candidates = [(k, t) for k, t in self._tails.items() if k[0] == parent]
            best_key, best, best_n = None, None, 0
            for key, tail in candidates:
                n = min(common_prefix_len(tail.tokens, rest), limit)
                if n > best_n:
                    best_key, best, best_n = key, tail, n
            if best is None:
                return None
            self._tails.move_to_end(best_key)
            self.hits += 1
        if best_n == len(best.tokens):
            return best
        return Tail(best.tokens[:best_n], tuple((k[:, :, :best_n], v[:, :, :best_n]) for k, v in best.layers))

    def snapshot(self) -> list[tuple[tuple[int | None, tuple[int, ...]], Tail]]:
        with self._lock:
            return list(self._tails.items())

    def restore(self, items: list[tuple[tuple[int | None, tuple[int, ...]], Tail]]) -> None:
        """Replace the contents with a snapshot (benchmarks rebuild identical states)."""
        self.clear()
        for (parent, _), tail in items:
            self.put(parent, tail)

    def clear(self) -> None:
        with self._lock:
            self._tails.clear()
            self._bytes = 0

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"tails": len(self._tails), "bytes": self._bytes, "budget_bytes": self.budget_bytes, "hits": self.hits}
