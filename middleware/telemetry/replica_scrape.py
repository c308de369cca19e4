"""Read replicas' own /metrics for the dashboard and /metrics: KV tiers, prompt and cached tokens,
running and waiting requests (which names each engine kind uses: middleware/telemetry/engine_metrics.py).

A replica that does not answer, answers slowly or exports something unparsable gives no reading
(None) for that interval: the dashboard shows a gap, the proxy is not otherwise affected.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Mapping, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvgate.middleware.engines.base import server_root
from kvgate.middleware.telemetry.stats_samples import Samples, flatten

log = logging.getLogger("kvgate.stats")
K = TypeVar("K")
MAX_METRICS_BYTES = 4 * 2**20  # a replica's exposition is a few KB; anything huge is not read


def metrics_url(api_base: str) -> str:
    """`http://host:port/v1` → `http://host:port/metrics` (where vLLM, SGLang and our replica serve it)."""
    return server_root(api_base) + "/metrics"


def parse_metrics(text: str | None) -> Samples | None:
    """Prometheus text → samples; None for no text or text that does not parse."""
    if text is None:
        return None
    try:
        return flatten(text_string_to_metric_families(text))
    except ValueError:
        return None


async def fetch_texts(client: httpx.AsyncClient, urls: Mapping[K, str]) -> dict[K, str | None]:
    """Every URL's body, fetched at once; None where it failed or was not a 200."""
    async def one(url: str) -> str | None:
        try:
            response = await client.get(url)
        except httpx.HTTPError:
            return None
        if response.status_code != 200 or len(response.content) > MAX_METRICS_BYTES:
            return None
        return response.text

    keys = list(urls)
    texts = await asyncio.gather(*(one(urls[k]) for k in keys))
    return dict(zip(keys, texts))
