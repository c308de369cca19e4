"""Any OpenAI-compatible server that is not a known engine (our reference replica included):
nothing to learn, nothing to send beyond the OpenAI request."""

from __future__ import annotations

import httpx

from kvgate.middleware.engines.base import EngineInfo


class GenericAdapter:
    kind = "openai"

    async def probe(self, client: httpx.AsyncClient, api_base: str) -> EngineInfo | None:
        response = await client.get(f"{api_base.rstrip('/')}/models")
        return EngineInfo("openai") if response.status_code < 500 else None
