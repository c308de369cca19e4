"""The Llama-shaped model of `kvgate bench kv-gpu`: random weights, grouped-query SDPA, SwiGLU,
RMSNorm, whose prefill a KV load replaces. It writes each layer's K and V into KV caches laid out
as vLLM 0.32 registers them on a GPU (one buffer, per-layer [B, H, N, C] views in the LBNHC
order FlashAttention uses), so the connector's worker classes move exactly that layout.

One layer's weights serve every layer: compute per token is a real model's, memory is one
layer's (both shapes then fit one GPU beside their KV). Positions are not rotated (RoPE costs
little next to the matmuls and does not change the KV's size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    kv_heads: int
    head: int
    hidden: int
    mlp: int
    q_heads: int

    @property
    def kv_bytes_per_token(self) -> int:  # bf16, all layers
        return 2 * self.layers * self.kv_heads * self.head * 2


SHAPES = {
    "llama-3-8b": Shape("llama-3-8b", 32, 8, 128, 4096, 14336, 32),
    # one rank of eight: 64/8 query heads, 8/8 KV heads, 28672/8 of the MLP; the residual stream stays whole
    "llama-3-70b-tp8": Shape("llama-3-70b-tp8", 80, 1, 128, 8192, 28672 // 8, 8),
}


def quick(shape: Shape) -> Shape:
    """The same model kind, small enough for a CPU test."""
    return Shape(shape.name, min(shape.layers, 3), min(shape.kv_heads, 2), 32, 128, 256, 2 * min(shape.kv_heads, 2))


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Model:
    def __init__(self, shape: Shape, device: torch.device, dtype: torch.dtype, seed: int = 0) -> None:
        g = torch.Generator(device="cpu").manual_seed(seed)
        s = shape

        def w(*dims: int) -> torch.Tensor:
            return (torch.randn(*dims, generator=g) / dims[0] ** 0.5).to(device=device, dtype=dtype)

        self.shape, self.device, self.dtype = shape, device, dtype
        self.qkv = w(s.hidden, (s.q_heads + 2 * s.kv_heads) * s.head)
        self.o = w(s.q_heads * s.head, s.hidden)
        self.up = w(s.hidden, 2 * s.mlp)
        self.down = w(s.mlp, s.hidden)
        self.embed = w(1024, s.hidden)

    def forward(
        self,
        tokens: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        kv_out: list[torch.Tensor] | None = None,
        slots: torch.Tensor | None = None,
        after_layer: Callable[[int], None] | None = None,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Prefill `tokens` after `past` (per layer K, V of [heads, T0, head]); returns this call's K, V
        per layer, and writes them into `kv_out`'s [B, H, N, C] views at token `slots` when given.
        `after_layer(i)` is called after layer i's attention, where vLLM calls save_kv_layer."""
        s = self.shape
        n = tokens.numel()
        x = self.embed[tokens % self.embed.shape[0]]
        new: list[tuple[torch.Tensor, torch.Tensor]] = []
        for layer in range(s.layers):
            h = F.rms_norm(x, (s.hidden,))
            q, k, v = (h @ self.qkv).split([s.q_heads * s.head, s.kv_heads * s.head, s.kv_heads * s.head], dim=-1)
            q = q.view(n, s.q_heads, s.head).transpose(0, 1)
            k = k.view(n, s.kv_heads, s.head).transpose(0, 1)
            v = v.view(n, s.kv_heads, s.head).transpose(0, 1)
            if kv_out is not None and slots is not None:
                write_kv(kv_out[layer], slots, k, v)
            new.append((k, v))
            # K, V repeated per query head, and a batch axis: SDPA's fused (flash, memory-efficient)
            # kernels take only [batch, heads, tokens, head]; without them it materializes T x T scores
            group = s.q_heads // s.kv_heads
            if past:
                k_all, v_all = torch.cat([past[layer][0], k], dim=1), torch.cat([past[layer][1], v], dim=1)
                t0 = past[layer][0].shape[1]
                mask = torch.ones(n, t0 + n, dtype=torch.bool, device=self.device).tril(diagonal=t0)
                kk, vv = k_all.repeat_interleave(group, 0), v_all.repeat_interleave(group, 0)
                a = F.scaled_dot_product_attention(q[None], kk[None], vv[None], attn_mask=mask)[0]
            else:
                kk, vv = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
                a = F.scaled_dot_product_attention(q[None], kk[None], vv[None], is_causal=True)[0]
            if after_layer is not None:
                after_layer(layer)
            x = x + a.transpose(0, 1).reshape(n, -1) @ self.o
            gate, up = (F.rms_norm(x, (s.hidden,)) @ self.up).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ self.down
        return new


def kv_caches(
    shape: Shape, num_blocks: int, block_size: int, device: torch.device, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Per-layer views of one buffer as vLLM 0.32 allocates them: logical [B, H, N, C] (C = K then
    V), physical order LBNHC (layer, block, token, head, content)."""
    s = shape
    raw = torch.zeros(s.layers, num_blocks, block_size, s.kv_heads, 2 * s.head, device=device, dtype=dtype)
    view = raw.permute(0, 1, 3, 2, 4)  # logical [L, B, H, N, C]
    return {f"model.layers.{i}.self_attn.attn": view[i] for i in range(s.layers)}


def write_kv(layer: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """What the attention backend's cache write does: token t of K, V ([heads, T, head]) to slot
    slots[t] (block slots // N, row slots % N) of a [B, H, N, C] view."""
    n_rows = layer.shape[2]
    blocks, rows = slots // n_rows, slots % n_rows
    both = torch.cat([k, v], dim=-1).transpose(0, 1)  # [T, heads, 2*head]
    layer[blocks, :, rows] = both
