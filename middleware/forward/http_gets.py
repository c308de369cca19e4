"""The proxy's background GETs (replicas' /metrics, /models, /version) on the relay's HTTP client.

The proxy reads every replica's /metrics every `engine_poll_s` and asks its /models every health
round, for as long as it runs, busy or idle. httpx, which the engine adapters and the health
loop are written against, costs several times what the relay's pooled client (`http1.Pool`)
does per GET, most of it on a large /metrics page. `PooledGets` is the part of
`httpx.AsyncClient` those callers use (`get`, `aclose`, `async with`), on a `Pool`: its answers
have `status_code`, `content`, `text` and `json()`, and its failures are httpx's exceptions
(`httpx.ConnectError` only when no connection could be opened: the health loop reads that as
"no engine there"), so the callers cannot tell the two apart.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx

from kvgate.middleware.forward.http1 import ConnectFailed, Pool

KEEPALIVE_S = 4.0  # a connection is kept between two rounds 2 s apart, and dropped before uvicorn's 5 s
ACCEPT = {"accept-encoding": "identity"}  # a /metrics page is read as it is: nobody compresses it


@dataclass
class Fetched:
    """A GET's answer, read whole."""

    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body's JSON; ValueError when it is not JSON (as httpx's)."""
        return json.loads(self.content)


class PooledGets:
    """`get(url, timeout=None)` on a keep-alive pool; one per task that uses it (its loop)."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self._pool = Pool(KEEPALIVE_S)

    async def get(self, url: str, timeout: float | None = None) -> Fetched:
        wait = self.timeout if timeout is None else timeout
        try:
            response = await self._pool.send("GET", url, b"", ACCEPT, wait)
            try:
                content = await response.read()
            finally:
                response.close()
        except ConnectFailed as exc:
            raise httpx.ConnectError(str(exc)) from exc
        except asyncio.TimeoutError as exc:
            raise httpx.TimeoutException(f"no answer from {url} in {wait} s") from exc
        except (ConnectionError, ValueError) as exc:
            raise httpx.TransportError(f"GET {url} failed: {exc}") from exc
        return Fetched(response.status, content)

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def __aenter__(self) -> "PooledGets":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
