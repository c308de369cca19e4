"""vLLM: version, block size, served model dir and KV-event sockets, from its own HTTP API.

- `GET /version` → `{"version": "0.32.0"}` (what marks a server as vLLM);
- `GET /v1/models` → `data[0].root`: the model dir or name it loaded (the tokenizer's home, and
  the model revision kvgate tags answers with: kvgate.middleware.engines.base.models_revision);
- `GET /metrics` → `vllm:cache_config_info{block_size=..., kv_cache_size_tokens=...}`;
- `GET /kv_event_sources` → its `--kv-events-config` per data-parallel rank: the publisher's
  endpoint (a concrete address means vLLM *connects* to it, so kvgate binds) and the replay one.

The KV event format, the block hash (sha256 of the pickled parent, tokens and extra keys) and
the cache_salt placement were checked against the versions in SUPPORTED; outside it the adapter
says so in `EngineInfo.error` (logged by the router) rather than trusting them.
"""

from __future__ import annotations

import re

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvgate.middleware.engines.base import EngineInfo, models_revision, server_root

SUPPORTED = ((0, 32, 0), (0, 33, 0))  # [low, high)
SUPPORTED_TEXT = "vLLM >= 0.32.0, < 0.33"


def parse_version(text: str) -> tuple[int, int, int] | None:
    """ "0.32.0", "0.32.1rc1+cpu" → (0, 32, 0), (0, 32, 1); None if it is not a version."""
    m = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    return None if m is None else (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def version_error(version: str) -> str | None:
    parsed = parse_version(version)
    if parsed is None:
        return f"vLLM reports version {version!r}, which kvgate cannot read; supported: {SUPPORTED_TEXT}"
    if not SUPPORTED[0] <= parsed < SUPPORTED[1]:
        return (
            f"vLLM {version} is outside the versions kvgate supports ({SUPPORTED_TEXT}): its KV events and "
            "block hashes were not checked against kvgate's; precise routing may not match"
        )
    return None


def cache_config(metrics_text: str) -> dict[str, str]:
    """The labels of `vllm:cache_config_info` ({} when absent or unparsable)."""
    try:
        for family in text_string_to_metric_families(metrics_text):
            if family.name == "vllm:cache_config_info":
                for sample in family.samples:
                    return dict(sample.labels)
    except ValueError:
        pass
    return {}


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "", "None") else None
    except (TypeError, ValueError):
        return None


def binds(endpoint: str) -> bool:
    """Whether vLLM binds this publisher endpoint (wildcards, ipc, inproc) rather than connects."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class VllmAdapter:
    kind = "vllm"

    async def probe(self, client: httpx.AsyncClient, api_base: str) -> EngineInfo | None:
        root = server_root(api_base)
        response = await client.get(f"{root}/version")
        if response.status_code != 200:
            return None
        try:
            version = response.json().get("version")
        except (ValueError, AttributeError):
            return None
        if not isinstance(version, str):
            return None
        model_root, max_model_len, revision = None, None, None
        models = await client.get(f"{api_base.rstrip('/')}/models")
        if models.status_code == 200:
            data = models.json().get("data") or [{}]
            model_root = data[0].get("root") or data[0].get("id")
            max_model_len = _int(data[0].get("max_model_len"))
            revision = models_revision(models.json())
        labels: dict[str, str] = {}
        metrics = await client.get(f"{root}/metrics")
        if metrics.status_code == 200:
            labels = cache_config(metrics.text)
        endpoint, replay = None, None
        sources = await client.get(f"{root}/kv_event_sources")
        if sources.status_code == 200:
            first = next(iter((sources.json() or {}).values()), None)
            if isinstance(first, dict) and first.get("enable_kv_cache_events"):
                endpoint, replay = first.get("endpoint"), first.get("replay_endpoint")
        return EngineInfo(
            "vllm",
            version=version,
            block_size=_int(labels.get("block_size")),
            model_root=model_root,
            kv_cache_tokens=_int(labels.get("kv_cache_size_tokens")),
            events_endpoint=endpoint,
            events_bind=endpoint is not None and not binds(endpoint),
            replay=replay,
            accepts_cache_salt=True,
            error=version_error(version),
            max_model_len=max_model_len,
            model_revision=revision,
        )
