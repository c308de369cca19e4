"""What a route knows of its replicas' engines: who runs what (kvgate.middleware.engines), and the
cache salt its requests carry where the engines take one (kvgate.middleware.routing.salt)."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Sequence

import httpx

from kvgate.middleware.engines.base import EngineInfo, models_revision
from kvgate.middleware.engines.discover import discover
from kvgate.middleware.routing.salt import Salter

log = logging.getLogger("kvgate.router")


class EngineBook:
    """Per replica, its EngineInfo once it answered; the route's salting rule.

    `on_found(name, info)` runs in a worker thread for each replica newly described (precise
    mode loads a tokenizer from what the engine said)."""

    def __init__(
        self,
        route: str,
        engine: str,
        cache_salt: bool,
        salter: Salter | None,
        on_found: Callable[[str, EngineInfo], None],
    ) -> None:
        self.route = route
        self.engine = engine
        self.cache_salt = cache_salt
        self._salter = salter
        self._on_found = on_found
        self.engines: dict[str, EngineInfo] = {}
        # the model revision each replica last reported: kept while its engine restarts (forget),
        # so an engine that is down makes no answer fresh again; dropped with the replica
        self.revisions: dict[str, str] = {}
        self._asking: asyncio.Lock | None = None  # one discovery at a time (made on the serving loop)

    def missing(self, names: Sequence[str]) -> list[str]:
        return [n for n in names if n not in self.engines]

    async def discover(self, replicas: Sequence[tuple[str, str]], client: httpx.AsyncClient | None = None) -> None:
        """Ask each (name, api_base) not yet described; one that does not answer is asked again
        on the next call."""
        if not [n for n, _ in replicas if n not in self.engines]:
            return
        if self._asking is None:
            self._asking = asyncio.Lock()
        async with self._asking:
            await self._discover([(n, base) for n, base in replicas if n not in self.engines], client)

    async def _discover(self, todo: list[tuple[str, str]], client: httpx.AsyncClient | None) -> None:
        own = client is None
        client = client or httpx.AsyncClient(timeout=2.0)
        try:
            found = await asyncio.gather(*(discover(client, base, self.engine) for _, base in todo))
            for (name, _), info in zip(todo, found):
                if info is not None:
                    await asyncio.to_thread(self._found, name, info)
        finally:
            if own:
                await client.aclose()

    def _found(self, name: str, info: EngineInfo) -> None:
        if info.error:
            log.error("route %s: replica %s: %s", self.route, name, info.error)
        else:
            log.info("route %s: replica %s runs %s %s", self.route, name, info.kind, info.version or "")
        self.engines[name] = info
        if info.model_revision is not None:
            if self.revisions.get(name) not in (None, info.model_revision):
                log.warning(
                    "route %s: replica %s now serves model revision %s (was %s)",
                    self.route,
                    name,
                    info.model_revision,
                    self.revisions[name],
                )
            self.revisions[name] = info.model_revision
        self._on_found(name, info)

    @property
    def revision(self) -> str | None:
        """The model revision the route serves now: its replicas' last reported revisions, sorted
        and joined by "+" (two while a rollout is half done); None while none reported one."""
        return "+".join(sorted(set(list(self.revisions.values())))) or None

    async def recheck(self, replicas: Sequence[tuple[str, str]], client: httpx.AsyncClient) -> None:
        """Ask each described replica that reported a model revision for it again (GET /models):
        an engine restarted with other weights between two health rounds is described anew (the
        next `discover`), so the route's revision moves with it."""
        for name, api_base in replicas:
            info = self.engines.get(name)
            if info is None or info.model_revision is None:
                continue
            try:
                response = await client.get(f"{api_base.rstrip('/')}/models", timeout=2.0)
                now = models_revision(response.json()) if response.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                continue  # down: the health probe's business
            if now is not None and now != info.model_revision:
                self.forget(name)

    def forget(self, name: str) -> None:
        self.engines.pop(name, None)

    def salt(self, tenant: str | None, client_salt: object = None) -> str | None:
        """The cache_salt for a request of `tenant` (None: scope shared), when the route salts:
        routing.cache_salt on and its engines take one (vLLM, configured or found)."""
        if self._salter is None or not self.cache_salt:
            return None
        if self.engine != "vllm" and not any(e.accepts_cache_salt for e in list(self.engines.values())):
            return None
        return self._salter.salt(tenant, client_salt)

    def describe(self, name: str) -> dict[str, object] | None:
        info = self.engines.get(name)
        return None if info is None else {"kind": info.kind, "version": info.version, "error": info.error}
