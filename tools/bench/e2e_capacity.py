"""KV sizes in `kvgate bench e2e`: bytes per token of the model, the conversations' working set, and
what one replica's store holds, so a run says whether it was under KV-capacity pressure (pure)."""

from __future__ import annotations

from typing import Any


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int = 4) -> int:
    """Bytes of K and V one token occupies across all layers (HF config.json fields)."""
    from types import SimpleNamespace

    from kvgate.engines.replica.model import kv_geometry

    layers, kv_heads, head_dim = kv_geometry(SimpleNamespace(**config))
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_working_set(records: list[dict[str, Any]], max_tokens: int, chunk_tokens: int, per_token: int) -> int:
    """Bytes of full chunks all conversations hold at their end: per conversation, its last
    prompt plus one answer, rounded down to whole chunks (what a chunk store keeps)."""
    final: dict[int, int] = {}
    for r in records:
        if r.get("prompt_tokens"):
            final[r["conversation"]] = max(final.get(r["conversation"], 0), r["prompt_tokens"] + max_tokens)
    return sum(n // chunk_tokens * chunk_tokens for n in final.values()) * per_token


def store_capacity_mb(ram_mb: int, disk_mb: int) -> int:
    """What one replica's chunk store can hold: the tiers are write-through (a chunk is written to
    every tier), so the largest tier bounds it, not their sum."""
    return max(ram_mb, disk_mb)
