"""What the pipeline hands back: how a request was served (CacheInfo) and its result."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from litellm import ModelResponse

from index.semantic import CacheEntry
from middleware.request_log import new_request_id

Tier = Literal["miss", "exact", "semantic"]


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
    explore: Any = None  # max_error_rate routes: a middleware.trust_gate.Exploration on an explored miss


@dataclass
class Result:
    info: CacheInfo
    response: ModelResponse | None = None
    stream: Any = None  # async iterator of ModelResponseStream; from `complete`, a sync one
    raw: Any = None  # a relayed miss (`acomplete(raw=True)`): the replica's JSON bytes, or an async iterator of SSE bytes
