"""kvgate middleware: the request pipeline and its faces (SDK, proxy, CLI)."""
from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from middleware.client import AsyncStream, Gateway, Stream, cache_info  # noqa: E402
from middleware.pipeline import CacheInfo  # noqa: E402

__all__ = ["Gateway", "Stream", "AsyncStream", "CacheInfo", "cache_info"]
