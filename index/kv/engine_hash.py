"""vLLM's own block hash of a chain's first block, to tell whether an engine hashes as vLLM's
default does (sha256, root seed fixed unless PYTHONHASHSEED is set).

kvgate never needs the engine's hashes to route (kvgate.index.kv.kv_events re-hashes the tokens an event
carries in kvgate's own space), but engines that share KV by hash (a shared KV tier, a
neighbour's connector) only share when they hash alike. vLLM hashes block i as

    H_i = sha256(pickle((H_{i-1}, tuple(tokens_i), extra_keys_i)))    H_{-1} = sha256(pickle(seed))

(pickle at the highest protocol; `extra_keys` None or a tuple of tagged keys such as
("cache_salt", salt)), and publishes the low 64 bits big-endian as the event's block hash. Only
a first block can be checked from one event (the others need the parent's full 32 bytes, and
events carry 64 bits), which is enough: a different seed or algorithm changes every first block.
"""

from __future__ import annotations

import hashlib
import pickle
from typing import Any, Sequence

VLLM_DEFAULT_SEED = "vllm-none-hash"


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def vllm_first_block_hash(tokens: Sequence[int], salt: str | None = None, seed: str = VLLM_DEFAULT_SEED) -> int:
    """The 64-bit event hash vLLM's sha256 gives a chain's first block of `tokens` (exactly one
    block's tokens), salted or not."""
    extra = (("cache_salt", salt),) if salt else None
    digest = _sha256((_sha256(seed), tuple(tokens), extra))
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)


def checkable_salt(extra_keys: Sequence[Any] | None) -> tuple[bool, str | None]:
    """(whether a first block's untagged event extra keys can be re-tagged for the check, the
    salt): only no keys or a lone cache salt can (LoRA and multimodal keys are ambiguous)."""
    if not extra_keys:
        return True, None
    if len(extra_keys) == 1 and isinstance(extra_keys[0], str):
        return True, extra_keys[0]
    return False, None
