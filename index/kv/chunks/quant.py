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


def _quantize(x: torch.Tensor, group: int, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped symmetric quantization: (integers in [-levels, levels] as int16, shaped
    [..., C/group, group]; scales [..., C/group] in scale_dtype(x.dtype))."""
    g = _groups(x.float(), group)
    scale = _scale(g.abs().amax(dim=-1), levels, scale_dtype(x.dtype))
    return torch.round(g / scale.float().unsqueeze(-1)).clamp_(-levels, levels).to(torch.int16), scale


def _apply_scale(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, group: int) -> torch.Tensor:
    """One allocation, one multiply in `dtype` (exact for the integers, rounded once)."""
    out = q.to(dtype)
    _groups(out, group).mul_(scale.to(dtype).unsqueeze(-1))
    return out


def quantize_int8(x: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., C] float (C a multiple of `group`) → (q int8 [..., C], scale [..., C/group] in
    scale_dtype(x.dtype))."""
    q, scale = _quantize(x, group, 127)
    return q.to(torch.int8).reshape(x.shape), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, group: int = 32) -> torch.Tensor:
    return _apply_scale(q, scale, dtype, group)


def quantize_int4(x: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., C] float (C a multiple of `group`, `group` even) → (packed uint8 [..., C/2],
    scale [..., C/group] in scale_dtype(x.dtype))."""
    q, scale = _quantize(x, group, 7)
    q = (q + 8).reshape(*x.shape[:-1], x.shape[-1] // 2, 2)  # 1..15, 8 is zero
    return (q[..., 0] | (q[..., 1] << 4)).to(torch.uint8), scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, group: int = 32) -> torch.Tensor:
    p = packed.to(torch.int16)
    q = torch.stack((p & 0xF, p >> 4), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2) - 8
    return _apply_scale(q, scale, dtype, group)
