"""kvgate middleware: the request pipeline and its faces (SDK, proxy, CLI).

`from kvgate import Gateway` (or `from kvgate.middleware import Gateway`) works, yet importing any submodule (say `kvgate.middleware.errors`)
does not load the SDK, the pipeline or LiteLLM: the public names below are resolved on first use
(PEP 562). Importing this package sets no environment variable: process-wide defaults belong to
the entry point (middleware/cli.py), LiteLLM's import-time switches to middleware/litellm_env.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvgate.middleware.pipeline import CacheInfo
    from kvgate.middleware.sdk.client import AsyncStream, Gateway, Stream, cache_info

__all__ = ["Gateway", "Stream", "AsyncStream", "CacheInfo", "cache_info"]
_HOMES = {
    "Gateway": "kvgate.middleware.sdk.client",
    "Stream": "kvgate.middleware.sdk.client",
    "AsyncStream": "kvgate.middleware.sdk.client",
    "cache_info": "kvgate.middleware.sdk.client",
    "CacheInfo": "kvgate.middleware.pipeline",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'kvgate.middleware' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(home), name)
