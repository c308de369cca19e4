"""KV quantization: pure functions from a float KV tensor to compact integers plus scales, and back.

Two schemes, both symmetric (zero maps to zero) and both taking their scales from the data itself,
so nothing is calibrated ahead of time:

* int8: one scale per group of `group` consecutive values along the last dimension (in vLLM's
  CPU layout a token's head holds its keys then its values, so a group of head_size values never
  mixes the two), scale = absmax / 127. Payload per group: `group` bytes + one 16-bit scale,
  against 2·group bytes of bf16/fp16 (ratio 0.531 at group 32, 0.516 at 64).
* int4: one scale per group of `group` consecutive values along the last dimension, values in
  [-7, 7], two values packed per byte (low nibble first). Ratio (group/2 + 2) / (2·group): 0.281
  at group 32.

Invariants: `dequantize_*(quantize_*(x))` has x's shape and dtype; every element differs from x
by at most half a quantization step of its group, i.e. absmax/254 for int8 and absmax/14 for
int4, plus one rounding to x's dtype. Scales are kept in x's 16-bit dtype (float16 for float32
KV) and are applied exactly as stored (the integers are computed with the stored, rounded scale), so a decoder on
any device reproduces the same values. Functions work on any torch device; they do not copy
inputs to the CPU.
"""
from __future__ import annotations

import torch

_FP16_TINY = 6.2e-5  # smallest normal float16: a scale below it would round to zero or lose precision


def scale_dtype(dtype: torch.dtype) -> torch.dtype:
    """Scales are kept in the KV's own 16-bit dtype (so dequantizing is one multiply in that dtype,
    rounded once), float16 for float32 KV."""
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.float16


def _scale(absmax: torch.Tensor, levels: int, dtype: torch.dtype) -> torch.Tensor:
    """Scales in `dtype`, never zero (an all-zero group gets the tiny scale and quantizes to 0)."""
    high = 65504.0 if dtype == torch.float16 else 3e38
    return (absmax.float() / levels).clamp(min=_FP16_TINY, max=high).to(dtype)


def _groups(x: torch.Tensor, group: int) -> torch.Tensor:
    c = x.shape[-1]
    if group < 2 or group % 2 or c % group:
        raise ValueError(f"need an even group that divides the last dimension ({c}), got {group}")
    return x.reshape(*x.shape[:-1], c // group, group)


def quantize_int8(x: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., C] float (C a multiple of `group`) → (q int8 [..., C], scale [..., C/group] in
    scale_dtype(x.dtype))."""
    g = _groups(x.float(), group)
    scale = _scale(g.abs().amax(dim=-1), 127, scale_dtype(x.dtype))
    q = torch.round(g / scale.float().unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    return q.reshape(x.shape), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, group: int = 32) -> torch.Tensor:
    """One allocation, one multiply in `dtype` (exact for the integers, rounded once)."""
    out = q.to(dtype)
    _groups(out, group).mul_(scale.to(dtype).unsqueeze(-1))
    return out


def quantize_int4(x: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., C] float (C a multiple of `group`, `group` even) → (packed uint8 [..., C/2],
    scale [..., C/group] in scale_dtype(x.dtype))."""
    c = x.shape[-1]
    g = _groups(x.float(), group)
    scale = _scale(g.abs().amax(dim=-1), 7, scale_dtype(x.dtype))
    q = torch.round(g / scale.float().unsqueeze(-1)).clamp_(-7, 7).to(torch.int16) + 8  # 1..15, 8 is zero
    q = q.reshape(*x.shape[:-1], c // 2, 2)
    packed = (q[..., 0] | (q[..., 1] << 4)).to(torch.uint8)
    return packed, scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, group: int = 32) -> torch.Tensor:
    p = packed.to(torch.int16)
    q = torch.stack((p & 0xF, p >> 4), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2) - 8
    c = q.shape[-1]
    out = q.to(dtype)
    _groups(out, group).mul_(scale.to(dtype).unsqueeze(-1))
    return out
