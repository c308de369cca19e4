"""A request's KV cache that grows in place: transformers' DynamicCache with layers whose keys and
values are views of buffers sized for the whole request.

transformers' DynamicLayer appends each forward's new K/V with `torch.cat`, a copy of the layer's
whole K and V every forward: after a long prefix is loaded from the store, that copy is paid again
by every forward that follows (the follow-up's new tokens, then each decoded token). A
`GrowingLayer` writes new K/V into room reserved up front (the prompt tokens still to feed and
the answer's max_tokens), so a forward copies only its own tokens; when a request outgrows its
room the buffer doubles (amortised O(1) per token).

Invariants
- `layer.keys` / `layer.values` are always [batch, heads, tokens, head_dim] holding exactly the
  tokens fed so far, in order, the same values DynamicLayer would hold: only where they live
  differs, so attention, slicing into chunks and tails (kvgate.engines.replica.kv_io) read the same
  numbers.
- A layer whose keys were replaced from outside (crop, reset) is re-homed in a fresh buffer on
  its next update, never written through a stale one.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose update writes into a preallocated buffer instead of concatenating."""

    def __init__(self, reserve: int = 0) -> None:
        super().__init__()
        self.reserve = max(0, reserve)
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def fill(self, key_parts: Sequence[torch.Tensor], value_parts: Sequence[torch.Tensor]) -> None:
        """Start the layer with the parts ([batch, heads, t_i, head_dim] each) one after another:
        one copy of each into a buffer with `reserve` tokens of room after them."""
        n = sum(int(k.shape[-2]) for k in key_parts)
        self.lazy_initialization(key_parts[0], value_parts[0])
        self._kbuf = self._new_buffer(key_parts[0], n + self.reserve)
        self._vbuf = self._new_buffer(value_parts[0], n + self.reserve)
        at = 0
        for k, v in zip(key_parts, value_parts):
            t = int(k.shape[-2])
            self._kbuf[:, :, at : at + t].copy_(k)
            self._vbuf[:, :, at : at + t].copy_(v)
            at += t
        self.keys, self.values = self._kbuf[:, :, :n], self._vbuf[:, :, :n]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, add = self.get_seq_length(), int(key_states.shape[-2])
        if not self._owns_keys(n) or n + add > self._kbuf.shape[-2]:  # type: ignore[union-attr]
            self._rehome(key_states, value_states, n, max(n + add + self.reserve, 2 * n))
        assert self._kbuf is not None and self._vbuf is not None
        self._kbuf[:, :, n : n + add].copy_(key_states)
        self._vbuf[:, :, n : n + add].copy_(value_states)
        self.keys, self.values = self._kbuf[:, :, : n + add], self._vbuf[:, :, : n + add]
        return self.keys, self.values

    def _owns_keys(self, n: int) -> bool:
        """True when keys/values are still the first n tokens of this layer's buffers."""
        return (
            self._kbuf is not None
            and self._vbuf is not None
            and n > 0
            and self.keys.data_ptr() == self._kbuf.data_ptr()
            and self.values.data_ptr() == self._vbuf.data_ptr()
        )

    def _rehome(self, key_like: torch.Tensor, value_like: torch.Tensor, n: int, capacity: int) -> None:
        kbuf, vbuf = self._new_buffer(key_like, capacity), self._new_buffer(value_like, capacity)
        if n:
            kbuf[:, :, :n].copy_(self.keys)
            vbuf[:, :, :n].copy_(self.values)
        self._kbuf, self._vbuf = kbuf, vbuf

    @staticmethod
    def _new_buffer(like: torch.Tensor, tokens: int) -> torch.Tensor:
        batch, heads, _, dim = like.shape
        return torch.empty((batch, heads, tokens, dim), dtype=like.dtype, device=like.device)


def growing_cache(
    config: Any, reserve: int, parts: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]] = ()
) -> DynamicCache:
    """A DynamicCache of GrowingLayers for a model with `config`, each holding `parts` (per part,
    per layer (keys, values)) one after another, with room for `reserve` more tokens.

    Models whose layers are not all plain DynamicLayers (sliding windows) get transformers' own
    DynamicCache, filled the same way."""
    cache = DynamicCache(config=config)
    if not all(type(layer) is DynamicLayer for layer in cache.layers):
        if parts:
            layers = [
                (torch.cat([p[i][0] for p in parts], dim=2), torch.cat([p[i][1] for p in parts], dim=2))
                for i in range(len(parts[0]))
            ]
            return DynamicCache(layers, config=config)
        return cache
    cache.layers = [GrowingLayer(reserve) for _ in cache.layers]
    if parts:
        for i, layer in enumerate(cache.layers):
            layer.fill([p[i][0] for p in parts], [p[i][1] for p in parts])
    return cache
