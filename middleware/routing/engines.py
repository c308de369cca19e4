"""What a route knows of its replicas' engines: who runs what (kvgate.middleware.engines), and the
cache salt its requests carry where the engines take one (kvgate.middleware.routing.salt)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Sequence

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
        self._asked_at: float | None = None  # when a discovery last finished (or was given up on)
        self._later: asyncio.Task[None] | None = None  # a discovery a request started and did not wait for

    def missing(self, names: Sequence[str]) -> list[str]:
        return [n for n in names if n not in self.engines]

    async def discover(
        self, replicas: Sequence[tuple[str, str]], client: httpx.AsyncClient | None = None, *, not_within: float = 0.0
    ) -> None:
        """Ask each (name, api_base) not yet described. Callers that queued behind a discovery in
        flight ask only for what it left undescribed, and nothing (no client made) when that is
        nothing. `not_within` (seconds; a request waiting for its route's engines): not when a
        discovery finished that recently, whatever it found, so a replica that is down is asked
        once per that interval, not by every request."""
        if not self.missing([n for n, _ in replicas]) or self._recent(not_within):
            return
        if self._asking is None:
            self._asking = asyncio.Lock()
        async with self._asking:
            todo = [(n, base) for n, base in replicas if n not in self.engines]
            if not todo or self._recent(not_within):
                return
            try:
                await self._discover(todo, client)
            finally:
                self._asked_at = time.monotonic()

    def discover_later(
        self, replicas: Sequence[tuple[str, str]], not_within: float, new_client: Callable[[], Any] | None = None
    ) -> bool:
        """Once a discovery has finished: `discover(replicas, not_within=...)` in a task of its
        own (one at a time; on a client from `new_client`, closed after) and True, for a request
        that must not wait on a replica that already failed to answer once; False before that
        (the caller waits on `discover`)."""
        if self._asked_at is None:
            return False
        busy = self._later is not None and not self._later.done()
        if not busy and self.missing([n for n, _ in replicas]) and not self._recent(not_within):
            self._later = asyncio.get_running_loop().create_task(self._ask_later(replicas, not_within, new_client))
            self._later.add_done_callback(_log_failure)
        return True

    async def _ask_later(
        self, replicas: Sequence[tuple[str, str]], not_within: float, new_client: Callable[[], Any] | None
    ) -> None:
        client = new_client() if new_client is not None else None
        try:
            await self.discover(replicas, client, not_within=not_within)
        finally:
            if client is not None:
                await client.aclose()

    def _recent(self, within: float) -> bool:
        return self._asked_at is not None and time.monotonic() - self._asked_at < within

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


def _log_failure(task: "asyncio.Task[None]") -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("engine discovery failed", exc_info=task.exception())
