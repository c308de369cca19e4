"""Read replicas' own /metrics for routing, the dashboard and /metrics: KV tiers, prompt and cached
tokens, running and waiting requests, prefill work and time (which names each engine kind uses:
middleware/telemetry/engine_metrics.py); the poller that reads them is replica_poll.py.

A replica that does not answer, answers slowly or exports something unparsable gives no reading
(None) for that interval: the dashboard shows a gap, the proxy is not otherwise affected.

vLLM's exposition is large (about 50 KB, 600 samples, mostly histogram buckets) and kvgate reads a
dozen of its samples, so `parse_metrics(text, names)` looks only at the lines of the samples named
(a prefix test per line) and parses those; prometheus_client's parser, which builds every family,
cost several ms per page here.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import AbstractSet, Mapping, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvgate.middleware.engines.base import server_root
from kvgate.middleware.telemetry.engine_metrics import ENGINE_SAMPLES
from kvgate.middleware.telemetry.stats import TIER_SAMPLES
from kvgate.middleware.telemetry.stats_samples import Samples, flatten

log = logging.getLogger("kvgate.stats")
K = TypeVar("K")
MAX_METRICS_BYTES = 4 * 2**20  # a replica's exposition is tens of KB; anything huge is not read
SCRAPED = ENGINE_SAMPLES | TIER_SAMPLES  # the samples routing, the dashboard and /metrics read of a replica
_LABELS = re.compile(r'\{((?:[^"}]|"(?:[^"\\]|\\.)*")*)\}')  # the label block: braces outside quotes
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def metrics_url(api_base: str) -> str:
    """`http://host:port/v1` → `http://host:port/metrics` (where vLLM, SGLang and our replica serve it)."""
    return server_root(api_base) + "/metrics"


def parse_metrics(text: str | None, names: AbstractSet[str] | None = None) -> Samples | None:
    """Prometheus text → samples (as stats_samples.flatten keys them); None for no text or text
    that does not parse. With `names`, only the samples of those names, and only their lines
    are checked (a line of another sample is skipped unread)."""
    if text is None:
        return None
    if names is None:
        try:
            return flatten(text_string_to_metric_families(text))
        except ValueError:
            return None
    prefixes = tuple(names)
    out: Samples = {}
    for line in text.split("\n"):
        if not line.startswith(prefixes):
            continue
        sample = _sample(line)
        if sample is None:
            return None
        if sample[0][0] in names:
            out[sample[0]] = sample[1]
    return out


def _sample(line: str) -> tuple[tuple[str, tuple[tuple[str, str], ...]], float] | None:
    """One exposition line `name{label="value",...} value [timestamp]` → (key, value); None if it
    is not one."""
    brace, space = line.find("{"), line.find(" ")
    labels: list[tuple[str, str]] = []
    if brace != -1 and (space == -1 or brace < space):
        block = _LABELS.match(line, brace)
        if block is None:
            return None
        name, rest = line[:brace], line[block.end() :]
        inner, pos = block.group(1), 0
        while pos < len(inner):
            label = _LABEL.match(inner, pos)
            if label is None or label.end() == pos:
                return None
            value = label.group(2)
            if "\\" in value:
                value = re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], value)
            labels.append((label.group(1), value))
            pos = label.end()
    elif space != -1:
        name, rest = line[:space], line[space:]
    else:
        return None
    parts = rest.split()
    try:
        value = float(parts[0])
    except (IndexError, ValueError):
        return None
    return (name, tuple(sorted(labels))), value


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
