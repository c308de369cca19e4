"""kvgate middleware: the request pipeline and its faces (SDK, proxy, CLI).

`from middleware import Gateway` works as before, but importing any submodule (say
`middleware.errors`) no longer loads the SDK, the pipeline or LiteLLM: the public names below are
resolved on first use (PEP 562).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# LiteLLM keeps idle backend connections 120 s; uvicorn-based servers (vLLM, our replicas) close
# them after 5 s, and reusing one the server is closing fails the request ("Connection error").
# Idle for less than the servers' timeout, a pooled connection is never one they have dropped.
os.environ.setdefault("AIOHTTP_KEEPALIVE_TIMEOUT", "3")

if TYPE_CHECKING:
    from middleware.client import AsyncStream, Gateway, Stream, cache_info
    from middleware.pipeline import CacheInfo

__all__ = ["Gateway", "Stream", "AsyncStream", "CacheInfo", "cache_info"]
_HOMES = {"Gateway": "middleware.client", "Stream": "middleware.client", "AsyncStream": "middleware.client",
          "cache_info": "middleware.client", "CacheInfo": "middleware.pipeline"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'middleware' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(home), name)
