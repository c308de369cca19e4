"""The engine's paged KV as the connector reads and writes it: per layer, whole blocks by id.

vLLM 0.32 registers one view per attention layer whose logical shape is blocks first,
[B, H, N, C] (C: a token's keys, then its values), for every backend: FlashAttention,
FlashInfer and the CPU backend differ only in strides (the physical orders LBNHC, LBHNC,
BLHNC, ...), which index_select and index_copy_ follow, so a chunk holds the same values
whatever the engine's physical layout. When a backend's kernel blocks are smaller than the
scheduler's, B is num_blocks x ratio and scheduler block b is rows b*ratio .. b*ratio+ratio-1.

The layouts with K and V apart, [2, num_blocks, block_size, heads, head_size] (FlashAttention's
own) and [num_blocks, 2, block_size, heads, head_size] (FlashInfer's), are read as well: chunks
then hold each block as [2, block_size, heads, head_size]. Any other shape is refused, naming it.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch


def block_axis(shape: Sequence[int], num_blocks: int | None) -> tuple[int, int]:
    """(axis of the blocks, kernel rows per scheduler block) of one layer's KV tensor.

    Invariant: the answer addresses every block: shape[axis] == num_blocks * ratio when
    num_blocks is known. K/V-first is recognised only as a 5-dimensional [2, num_blocks, ...];
    otherwise blocks come first. Raises ValueError naming the shape when neither fits."""
    shape = tuple(int(d) for d in shape)
    kv_first = len(shape) == 5 and shape[0] == 2 and (num_blocks is None or shape[1] == num_blocks)
    if kv_first:
        return 1, 1
    if len(shape) >= 2 and (num_blocks is None or (num_blocks > 0 and shape[0] % num_blocks == 0)):
        return 0, 1 if num_blocks is None else shape[0] // num_blocks
    raise ValueError(
        f"unsupported KV cache layout {list(shape)} for {num_blocks} blocks: kvgate's connector reads "
        "blocks-first views ([num_blocks, ...]: vLLM's [B, H, N, C], FlashInfer's [num_blocks, 2, block_size, "
        "heads, head_size]) and FlashAttention's [2, num_blocks, block_size, heads, head_size]"
    )


class PagedKV:
    """The engine's per-layer KV tensors; gather and scatter of whole blocks."""

    def __init__(self, kv_caches: dict[str, torch.Tensor], num_blocks: int | None = None) -> None:
        if not kv_caches:
            raise ValueError("vLLM registered no KV caches")
        self.names = list(kv_caches)
        self.layers = [kv_caches[n] for n in self.names]
        first = self.layers[0]
        for name, t in zip(self.names, self.layers):
            if not isinstance(t, torch.Tensor) or t.shape != first.shape or t.dtype != first.dtype:
                raise ValueError(
                    f"layer {name}: KV caches of different shapes or types ({tuple(t.shape)}) "
                    "are not supported by kvgate's connector (hybrid or per-layer layouts)"
                )
        self.axis, self.ratio = block_axis(first.shape, num_blocks)
        self.device = first.device
        self.dtype = first.dtype
        shape = list(first.shape)
        del shape[self.axis]
        self.row_shape = tuple(shape)  # one kernel block
        self.block_shape = self.row_shape  # kept for logs: what one stored row looks like
        self.block_bytes = math.prod(self.row_shape) * self.ratio * first.element_size() * len(self.layers)

    def rows(self, block_ids: Sequence[int]) -> list[int]:
        """Kernel rows of scheduler blocks, in order."""
        r = self.ratio
        return [b * r + j for b in block_ids for j in range(r)] if r > 1 else list(block_ids)

    def index(self, block_ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor(self.rows(block_ids), dtype=torch.long, device=self.device)

    def chunk_shape(self, n_blocks: int) -> tuple[int, ...]:
        """One layer's shape in a chunk of `n_blocks` scheduler blocks."""
        return (n_blocks * self.ratio, *self.row_shape)

    def read(self, layer: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        rows = layer.index_select(self.axis, idx)
        return rows if self.axis == 0 else rows.movedim(self.axis, 0)

    def write(self, layer: torch.Tensor, idx: torch.Tensor, rows: torch.Tensor) -> None:
        layer.index_copy_(self.axis, idx, rows if self.axis == 0 else rows.movedim(0, self.axis))

    def scatter(self, rows: list[torch.Tensor], block_ids: Sequence[int]) -> None:
        idx = self.index(block_ids)
        for kv, r in zip(self.layers, rows):
            self.write(kv, idx, r)
