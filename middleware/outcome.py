"""What the pipeline hands back: how a request was served (CacheInfo) and its result."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from kvgate.middleware.litellm_env import litellm  # noqa: F401  (before any import from litellm)

# isort: split
from litellm import ModelResponse

from kvgate.index.responses.semantic import CacheEntry

Tier = Literal["miss", "exact", "semantic"]
REQUEST_ID_PREFIX = "kvg-"


def new_request_id() -> str:
    """An unguessable id (128 random bits, 32 hex digits), so knowing one proves having seen the
    response."""
    return REQUEST_ID_PREFIX + secrets.token_hex(16)


@dataclass
class CacheInfo:
    """How a request was served. On SDK responses: `response._hidden_params["kvgate"]`."""

    cache: Tier
    route: str
    similarity: float | None = None
    entry_id: int | None = None
    stored: bool = False
    replica: str | None = None  # the replica that answered a miss, on routes with replicas
    expected_cached_tokens: int | None = None  # the prefix the router expected that replica to hold
    request_id: str = field(default_factory=new_request_id)  # for POST /v1/cache/feedback
    skipped: str | None = None  # why the cache was neither read nor written (an answer not a function of the key)
    entry_age_s: float | None = None  # a hit: how long ago the entry that served it was stored
    # perf_counter stamps: the pipeline's start, then on a relayed miss the request sent to the
    # answering replica and its first bytes read (the proxy's Server-Timing header)
    timing: tuple[float, ...] = field(default=(), repr=False, compare=False)
    # max_error_rate routes: the candidate this miss explores (compared with the answer once in)
    exploration: Any = field(default=None, repr=False, compare=False)


@dataclass
class Hit:
    entry: CacheEntry
    tier: Tier
    similarity: float | None = None


@dataclass
class Lookup:
    hit: Hit | None = None
    vector: np.ndarray | None = None  # the query embedding, reused when storing
    explore: Any = None  # max_error_rate routes: a kvgate.middleware.cache.trust_gate.Exploration on an explored miss


@dataclass
class Result:
    info: CacheInfo
    response: ModelResponse | None = None
    stream: Any = None  # async iterator of ModelResponseStream; from `complete`, a sync one
    raw: Any = (
        None  # `acomplete(raw=True)`: a relayed miss's JSON bytes or async iterator of SSE bytes, a hit's JSON bytes
    )
