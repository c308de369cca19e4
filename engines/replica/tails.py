"""The KV of the partial chunk after a conversation's last full chunk: RAM, spilled to disk.

The chunk store holds only full chunks, so without this every later turn re-prefills up to
chunk_tokens − 1 tokens of history (the tail of the previous prompt + the previous answer) before
its own new tokens: on a CPU, most of a warm turn's TTFT.

Invariant: a tail is stored under the chained hash of the full chunk before it (None at the
start), which covers every earlier token, and carries its own token ids; it is reused only for a
prompt whose tokens after those full chunks begin with (a prefix of) the tail's tokens. Keys are
after RoPE, so a tail is valid exactly at the absolute position it was computed at — which is
where it is used, right after the same full chunks.

Spill: with a `spill` tier (the replica's disk tier) every tail of at least KEY_TOKENS tokens is
also written there, so a replica whose RAM was emptied or restarted — or another replica sharing
the directory — still skips those tokens. The chunk store's keys stay full chunks only; a tail is
its own object, key = (namespace, parent, digest of its first KEY_TOKENS tokens), replaced by the
latest writer (a conversation's next turn extends the same tail), its token ids in the codec's
checksummed header. A lookup reads the one key the prompt's next KEY_TOKENS tokens name and uses
the common prefix of the stored token ids and the prompt, so a stale or colliding tail can only
give fewer reused tokens, never KV for other tokens.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import xxhash

from kvgate.index.kv.chunks.base import StorageTier
from kvgate.index.kv.chunks.codec import CorruptChunk, decode_chunk_meta, encode_chunk
from kvgate.index.kv.hashing import common_prefix_len

log = logging.getLogger("kvgate.replica.tails")
TAILS_PER_PARENT = 4  # distinct continuations of one prefix kept at once
KEY_TOKENS = 16  # a spilled tail is found by its first tokens; shorter tails are cheap to prefill


def spill_key(namespace: str, parent: int | None, tokens: Sequence[int]) -> str:
    """The spill tier key of a tail after `parent` starting with tokens[:KEY_TOKENS]
    (pure; needs len(tokens) >= KEY_TOKENS)."""
    head = xxhash.xxh3_64_hexdigest(",".join(map(str, tokens[:KEY_TOKENS])).encode())
    return f"tail:{namespace}:{'root' if parent is None else f'{parent:016x}'}:{head}"


@dataclass(frozen=True)
class Tail:
    tokens: tuple[int, ...]
    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer (keys, values) [1, heads, t, d]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


class TailCache:
    """LRU of tails under a byte budget, optionally spilled to a tier; thread-safe."""

    def __init__(self, budget_bytes: int, spill: StorageTier | None = None, namespace: str = "") -> None:
        self.budget_bytes = budget_bytes
        self.spill = spill if budget_bytes > 0 else None
        self.namespace = namespace
        self.spill_hits = 0
        self.spill_corrupt = 0
        self._tails: OrderedDict[tuple[int | None, tuple[int, ...]], Tail] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0

    def put(self, parent: int | None, tail: Tail) -> None:
        new = self._put_ram(parent, tail)
        # a tail already in RAM was spilled when it arrived: a repeated prompt rewrites nothing
        if new and self.spill is not None and len(tail.tokens) >= KEY_TOKENS:
            key = spill_key(self.namespace, parent, tail.tokens)
            data = encode_chunk(list(tail.layers), key, meta={"tokens": list(tail.tokens)})
            try:
                self.spill.delete(key)  # replace: the latest turn's tail extends the last one
                self.spill.put(key, data)
            except Exception:  # a failing spill must not fail the request
                log.exception("spilling a KV tail failed")

    def _put_ram(self, parent: int | None, tail: Tail) -> bool:
        """Keep `tail` in RAM; False when the same tail (parent and tokens) was already there."""
        if not tail.tokens or tail.nbytes > self.budget_bytes:
            return True
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
        return old is None

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
            if best is not None:
                self._tails.move_to_end(best_key)
                self.hits += 1
        # the spill only when RAM has (next to) nothing: RAM tails are this replica's latest
        if best_n < KEY_TOKENS <= min(len(rest), limit):
            spilled = self._from_spill(parent, rest)
            n = min(common_prefix_len(spilled.tokens, rest), limit) if spilled is not None else 0
            if spilled is not None and n > best_n:
                self._put_ram(parent, spilled)  # promote
                best, best_n = spilled, n
                with self._lock:
                    self.spill_hits += 1
        if best is None:
            return None
        if best_n == len(best.tokens):
            return best
        return Tail(best.tokens[:best_n], tuple((k[:, :, :best_n], v[:, :, :best_n]) for k, v in best.layers))

    def _from_spill(self, parent: int | None, rest: Sequence[int]) -> Tail | None:
        if self.spill is None:
            return None
        key = spill_key(self.namespace, parent, rest)
        try:
            data = self.spill.get(key)
            if data is None:
                return None
            layers, meta = decode_chunk_meta(data, key)
            tokens = tuple(int(t) for t in (meta or {})["tokens"])
            if any(k.shape[2] != len(tokens) or v.shape[2] != len(tokens) for k, v in layers):
                raise CorruptChunk(f"tail {key!r}: {len(tokens)} token ids for KV of another length")
        except (CorruptChunk, KeyError, TypeError, ValueError, IndexError) as e:
            log.warning("dropping unreadable KV tail %s: %s", key, e)
            self.spill.delete(key)
            with self._lock:
                self.spill_corrupt += 1
            return None
        return Tail(tokens, tuple((k, v) for k, v in layers))

    def snapshot(self) -> list[tuple[tuple[int | None, tuple[int, ...]], Tail]]:
        with self._lock:
            return list(self._tails.items())

    def restore(self, items: list[tuple[tuple[int | None, tuple[int, ...]], Tail]]) -> None:
        """Replace the contents with a snapshot (benchmarks rebuild identical states)."""
        self.clear()
        for (parent, _), tail in items:
            self._put_ram(parent, tail)

    def clear(self) -> None:
        with self._lock:
            self._tails.clear()  # RAM only: the spill tier is the store's to clear
            self._bytes = 0

    def stats(self) -> dict[str, Any]:
        """RAM contents and counters: "hits" served from RAM, "spill_hits" read back from the
        spill tier (named "spill_tier", None without one), "spill_corrupt" spilled tails that
        failed verification (dropped)."""
        with self._lock:
            return {
                "tails": len(self._tails),
                "bytes": self._bytes,
                "budget_bytes": self.budget_bytes,
                "hits": self.hits,
                "spill_hits": self.spill_hits,
                "spill_corrupt": self.spill_corrupt,
                "spill_tier": None if self.spill is None else self.spill.name,
            }
