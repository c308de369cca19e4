"""What an engine adapter finds out about one replica, and the Protocol every adapter follows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import httpx


@dataclass(frozen=True)
class EngineInfo:
    """One replica's engine as it describes itself. Fields it did not tell are None.

    `events_bind`: the subscriber must bind the replica's events endpoint (vLLM publishes by
    connecting to a concrete address); `replay`: the engine's replay socket, where it has one.
    `error`: why kvgate cannot rely on this engine's settings (an unsupported version, say);
    routing still works, precise matching and salting may not.
    """

    kind: str
    version: str | None = None
    block_size: int | None = None
    model_root: str | None = None
    kv_cache_tokens: int | None = None
    events_endpoint: str | None = None
    events_bind: bool = False
    replay: str | None = None
    accepts_cache_salt: bool = False
    error: str | None = None
    max_model_len: int | None = None  # the context the engine refuses prompts beyond (vLLM's /v1/models)
    model_revision: str | None = None  # what the engine says of the weights it loaded (`models_revision`)


class EngineAdapter(Protocol):
    """Asks a replica what it is. `probe` returns None when the replica is not this kind of
    engine, and raises httpx.HTTPError when it cannot be reached."""

    kind: str

    async def probe(self, client: httpx.AsyncClient, api_base: str) -> EngineInfo | None: ...


def models_revision(payload: Any) -> str | None:
    """The model revision an engine's `GET /v1/models` answer tells: its first model's `revision`
    where the server reports one, else its `root` (vLLM 0.32: the path or hub name it loaded, so
    a revision served from its own snapshot directory shows; a hub name with `--revision` does
    not: set the route's `model_revision` for that)."""
    data = payload.get("data") if isinstance(payload, dict) else None
    card = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    found = card.get("revision") or card.get("root")
    return found if isinstance(found, str) and found else None


def server_root(api_base: str) -> str:
    """`http://host:port/v1` → `http://host:port` (where /version, /metrics, /health live)."""
    base = api_base.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base
