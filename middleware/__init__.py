"""kvgate middleware: the request pipeline and its faces (SDK, proxy, CLI)."""
from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# LiteLLM keeps idle backend connections 120 s; uvicorn-based servers (vLLM, our replicas) close
# them after 5 s, and reusing one the server is closing fails the request ("Connection error").
# Idle for less than the servers' timeout, a pooled connection is never one they have dropped.
os.environ.setdefault("AIOHTTP_KEEPALIVE_TIMEOUT", "3")

from middleware.client import AsyncStream, Gateway, Stream, cache_info  # noqa: E402
from middleware.pipeline import CacheInfo  # noqa: E402

__all__ = ["Gateway", "Stream", "AsyncStream", "CacheInfo", "cache_info"]
