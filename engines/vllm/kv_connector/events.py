"""The connector's KV events: which blocks each of its tiers holds, in vLLM's event format.

Each tier is its own `medium` so the router can tell the engine's cache ("GPU", from vLLM's block
pool) from a tier's copy. A tier that engines share carries an identity in its medium: "disk:<id>"
for a directory (a digest of its real path), "remote:<id>" for a Redis (of its address and key
prefix); "memory" is never shared. Two engines reporting the same medium therefore read each
other's chunks, which the router learns from the events alone.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from kvgate.engines.vllm.kv_connector.settings import ConnectorSettings


def media(settings: ConnectorSettings) -> dict[str, str]:
    """tier name → medium."""
    out: dict[str, str] = {}
    if settings.memory:
        out["memory"] = "memory"
    if settings.disk:
        out["disk"] = "disk:" + hashlib.sha256(os.path.realpath(settings.disk.path).encode()).hexdigest()[:12]
    if settings.remote:
        where = settings.remote.url.split("@")[-1] + "|" + settings.remote.key_prefix
        out["remote"] = "remote:" + hashlib.sha256(where.encode()).hexdigest()[:12]
    return out


def stored(hashes: list[int], block_size: int, medium: str) -> Any:
    """BlockStored for blocks the engine computed (no token ids: the router already mapped them
    from the engine's own event for the same blocks, and only adds the medium)."""
    from vllm.distributed.kv_events import BlockStored

    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=[],
        block_size=block_size,
        lora_id=None,
        medium=medium,
        lora_name=None,
    )


def removed(hashes: list[int], medium: str) -> Any:
    from vllm.distributed.kv_events import BlockRemoved

    return BlockRemoved(block_hashes=hashes, medium=medium)
