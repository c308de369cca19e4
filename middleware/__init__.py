"""kvgate middleware: the request pipeline and its faces (SDK, proxy, CLI).

`from middleware import Gateway` works, yet importing any submodule (say `middleware.errors`)
does not load the SDK, the pipeline or LiteLLM: the public names below are resolved on first use
(PEP 562). Importing this package sets no environment variable: process-wide defaults belong to
the entry point (middleware/cli.py), LiteLLM's import-time switches to middleware/litellm_env.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from middleware.sdk.client import AsyncStream, Gateway, Stream, cache_info
    from middleware.pipeline import CacheInfo

__all__ = ["Gateway", "Stream", "AsyncStream", "CacheInfo", "cache_info"]
_HOMES = {"Gateway": "middleware.sdk.client", "Stream": "middleware.sdk.client", "AsyncStream": "middleware.sdk.client",
          "cache_info": "middleware.sdk.client", "CacheInfo": "middleware.pipeline"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'middleware' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(home), name)
