"""The replica's attention: torch SDPA over the model's KV heads as they are (grouped-query).

transformers' "sdpa" attention repeats every KV head for each query head it serves before a
prefill forward that carries a mask (SmolLM2: 3 KV heads → 9, a copy of the layer's whole K and V
on every forward, growing with the loaded context). torch's SDPA takes the KV heads as they are
(`enable_gqa=True`, the CPU flash kernel included), so this implementation passes them through;
forwards of few queries (a follow-up's new tokens, a decode step) run as two batched matmuls over
the KV heads instead. A torch-profiler run of the 22-token forward after 1,989 loaded tokens,
taken while other work shared the CPU, put most of that forward in the repeat copies. The gain
shows when the CPU is contended; on an idle machine it is within noise, so this is not a
speed-up to expect everywhere, only copies that are never made.

Invariant: the same attention for every forward of a replica, cold or warm, so a run that loads
KV from the store and a cold run go through the same kernels (kvgate.engines.replica.runner's
exact_prefill invariant is unchanged); the result equals transformers' "sdpa" up to float
rounding (tests/test_replica_attention.py).
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "kvgate_sdpa_gqa"
MATH_MAX_QUERIES = 64


def _grouped_math_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scaling: float | None
) -> torch.Tensor:
    """softmax(q·kᵀ·scale + mask)·v with each KV head's query heads stacked along the query axis:
    two batched matmuls over the KV heads as they are (no copy of K or V, strided views welcome).
    Returns [b, q, heads, d]."""
    b, heads, q, d = query.shape
    kv_heads, n = key.shape[1], key.shape[2]
    group = heads // kv_heads
    scale = scaling if scaling is not None else d**-0.5
    scores = torch.matmul(query.reshape(b, kv_heads, group * q, d), key.transpose(-1, -2)).mul_(scale)
    scores = scores.view(b, kv_heads, group, q, n)
    if mask is not None:  # [b, 1, q, n]: bool (True = attend) or additive
        m = mask.unsqueeze(2)
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m
    probs = torch.softmax(scores, dim=-1).view(b, kv_heads, group * q, n)
    return torch.matmul(probs, value).view(b, heads, q, d).transpose(1, 2).contiguous()


def gqa_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [b, heads, q, d], key/value [b, kv_heads, k, d]
    → ([b, q, heads, d], no weights)."""
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # without a mask, SDPA's is_causal aligns the triangle top-left: right only when q and kv are
    # the same span (transformers passes a mask whenever past KV precedes the queries)
    causal = bool(causal and attention_mask is None and q_len > 1)
    if causal and kv_len != q_len:
        raise ValueError(f"causal attention without a mask over {q_len} queries and {kv_len} keys")
    if q_len <= MATH_MAX_QUERIES and not causal:
        return _grouped_math_attention(query, key, value, attention_mask, scaling), None
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def use_gqa_attention(model: Any) -> None:
    """Switch `model` (a transformers causal LM) to `gqa_sdpa_attention`, with the masks its "sdpa"
    attention gets. Registering under one name is idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, gqa_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
