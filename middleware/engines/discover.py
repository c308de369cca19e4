"""Which adapter speaks for a replica: the route's `routing.engine`, or (auto) the first that
recognises it, vLLM before the generic OpenAI server."""

from __future__ import annotations

import httpx

from kvgate.middleware.engines.base import EngineAdapter, EngineInfo
from kvgate.middleware.engines.generic import GenericAdapter
from kvgate.middleware.engines.vllm import VllmAdapter

ADAPTERS: dict[str, EngineAdapter] = {"vllm": VllmAdapter(), "openai": GenericAdapter()}
AUTO_ORDER = ("vllm", "openai")


async def discover(client: httpx.AsyncClient, api_base: str, engine: str = "auto") -> EngineInfo | None:
    """The replica's EngineInfo; None while it cannot be reached (ask again later). A replica
    configured as vLLM that does not answer like one gets an EngineInfo with `error` set."""
    names = AUTO_ORDER if engine == "auto" else (engine,)
    try:
        for name in names:
            info = await ADAPTERS[name].probe(client, api_base)
            if info is not None:
                return info
    except (httpx.HTTPError, ValueError):
        return None
    return EngineInfo(engine, error=f"the replica at {api_base} does not answer like a {engine} server")
