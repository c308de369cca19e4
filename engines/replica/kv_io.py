"""Moving KV between a request's transformers DynamicCache and the replica's stores: the longest
stored prefix of full chunks (kvgate.index.kv.chunks.ChunkStore) plus the partial tail after them
(kvgate.engines.replica.tails.TailCache) on the way in; the new full chunks and the new tail on the way out.

Invariants
- KV is position-dependent (keys are stored after RoPE), so a chunk is only valid at its
  absolute position. Chunk i's hash covers every token before its end, so a chunk found by the
  prefix walk sits at exactly the position it was computed at.
- At least one prompt token is always prefilled: loaded tokens are capped at len(prompt) - 1,
  and full chunks at that rounded down to whole chunks (the model needs a new token to
  produce logits).
- Only tokens whose KV is in the cache are stored: `save` cuts at min(len(tokens), cache length),
  so the last sampled token (EOS, the max_tokens-th token, or one after a cancel), which is never
  fed back, is never part of a chunk or a tail.
- A chunk of the wrong shape or dtype for this model (another geometry under the same
  namespace) is never loaded: loading stops before it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from kvgate.engines.replica.kv_cache import growing_cache
from kvgate.engines.replica.model import kv_geometry
from kvgate.engines.replica.tails import Tail, TailCache
from kvgate.index.kv.chunks import ChunkStore, KVChunk, chunk_hashes
from kvgate.index.kv.hashing import BlockHash

log = logging.getLogger("kvgate.replica")


def loadable_chunks(prompt_tokens: int, chunk_tokens: int) -> int:
    """Full chunks of a prompt that may come from the store: those ending before its last token
    (which must be fed to get logits)."""
    return max(0, prompt_tokens - 1) // chunk_tokens


def chunk_parts(chunks: list[KVChunk]) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Stored chunks (per layer (keys, values) [heads, chunk_tokens, head_dim]) as cache parts:
    per layer [1, heads, chunk_tokens, head_dim] views (no copy)."""
    return [[(k.unsqueeze(0), v.unsqueeze(0)) for k, v in chunk] for chunk in chunks]


def slice_chunks(cache: Any, first: int, last: int, chunk_tokens: int) -> list[KVChunk]:
    """Chunks first..last-1 of `cache` as stand-alone tensors [heads, chunk_tokens, head_dim]
    (contiguous copies: the cache's buffers keep changing after this)."""
    ct = chunk_tokens
    return [
        [
            (layer.keys[0, :, a : a + ct].contiguous(), layer.values[0, :, a : a + ct].contiguous())
            for layer in cache.layers
        ]
        for a in range(first * ct, last * ct, ct)
    ]


@dataclass(frozen=True)
class Loaded:
    """A request's starting cache: `chunks` full chunks from the store, then maybe a tail;
    `cached` prompt tokens in all (the first one to feed)."""

    cache: Any
    chunks: int
    cached: int


class KVIO:
    """Load and save the KV of one model's requests (thread-confined: the engine's worker)."""

    def __init__(self, model: Any, store: ChunkStore | None, chunk_tokens: int, tails: TailCache) -> None:
        self.model_config = model.config
        self.dtype = model.dtype
        self.store = store
        self.chunk_tokens = chunk_tokens
        self.tails = tails
        self.n_layers, kv_heads, head_dim = kv_geometry(model.config)
        self.kv_shape = (kv_heads, chunk_tokens, head_dim)

    def uncached_estimate(self, tokens: list[int]) -> int:
        """Prompt tokens not covered by stored full chunks (the queue's ordering key; tails and
        chunks evicted before the job runs make it approximate, never wrong)."""
        n, ct = len(tokens), self.chunk_tokens
        if self.store is None or n <= ct:
            return n
        return n - self.store.longest_prefix(chunk_hashes(tokens, ct)[: loadable_chunks(n, ct)]) * ct

    def load(self, tokens: list[int], reserve: int = 0) -> Loaded:
        """The longest stored prefix of `tokens`' full chunks, then the best tail after it
        (never the whole prompt: one token must be fed), in one cache (kvgate.engines.replica.kv_cache)
        with room for the prompt's other tokens and `reserve` more."""
        ct, n = self.chunk_tokens, len(tokens)
        hashes = chunk_hashes(tokens, ct)
        chunks = self._read_chunks(hashes[: loadable_chunks(n, ct)])
        loaded = len(chunks)
        cached = loaded * ct
        tail = self.tails.best(hashes[loaded - 1] if loaded else None, tokens[cached:], n - 1 - cached)
        if tail is not None:
            cached += len(tail.tokens)
        parts = chunk_parts(chunks) + ([list(tail.layers)] if tail is not None else [])
        # one copy of the loaded KV, into the buffers the request then grows in
        return Loaded(growing_cache(self.model_config, n - cached + reserve, parts), loaded, cached)

    def save(self, tokens: list[int], cache: Any, loaded: int) -> tuple[int, list[BlockHash]]:
        """Put the full chunks `cache` holds beyond the first `loaded` into the store (`tokens`:
        what was fed, and maybe one more) and keep the partial one after them as a tail.
        Returns (chunks newly stored, hashes of the chain's leading chunks the store now holds:
        what may be announced; a chunk a tier refused is not)."""
        stored, held = self._store(tokens, cache, loaded)
        self._keep_tail(tokens, cache)
        return stored, held

    def _read_chunks(self, hashes: list[BlockHash]) -> list[KVChunk]:
        """The longest loadable run of `hashes` from the store (stops before a chunk of the wrong
        shape for this model)."""
        if self.store is None or not hashes:
            return []
        k = self.store.longest_prefix(hashes)
        chunks = self.store.get_many(hashes[:k]) if k else []
        bad = next((i for i, ch in enumerate(chunks) if not self._fits(ch)), None)
        if bad is not None:
            log.warning("KV chunk %d has the wrong shape for this model; using %d chunks", bad, bad)
            chunks = chunks[:bad]
        return chunks

    def _store(self, tokens: list[int], cache: Any, loaded: int) -> tuple[int, list[BlockHash]]:
        ct = self.chunk_tokens
        n_full = min(len(tokens), cache.get_seq_length()) // ct
        if n_full == 0 or self.store is None:
            return 0, []
        hashes = chunk_hashes(tokens[: n_full * ct], ct)
        stored = 0
        if n_full > loaded:
            first = max(loaded, self.store.longest_prefix(hashes))
            if first < n_full:
                try:
                    stored = self.store.put_many(hashes[first:], slice_chunks(cache, first, n_full, ct))
                except Exception:  # a failing store must not fail the request
                    log.exception("storing KV chunks failed")
        return stored, hashes[: self.store.longest_prefix(hashes)]

    def _keep_tail(self, tokens: list[int], cache: Any) -> None:
        """Remember the KV after the last full chunk that `cache` holds (tokens it has KV for)."""
        if self.tails.budget_bytes <= 0:
            return
        ct, length = self.chunk_tokens, min(len(tokens), cache.get_seq_length())
        full = length // ct
        if length == full * ct:
            return
        parent = chunk_hashes(tokens[: full * ct], ct)[-1] if full else None
        layers = tuple(
            (layer.keys[:, :, full * ct : length].clone(), layer.values[:, :, full * ct : length].clone())
            for layer in cache.layers
        )
        self.tails.put(parent, Tail(tuple(tokens[full * ct : length]), layers))

    def _fits(self, chunk: KVChunk) -> bool:
        return len(chunk) == self.n_layers and all(
            tuple(k.shape) == self.kv_shape and tuple(v.shape) == self.kv_shape and k.dtype == self.dtype
            for k, v in chunk
        )
