"""Admission control: at most `server.max_in_flight` completions (chat and text) at once; the rest get 429.

A proxy past its capacity does not get faster by queueing more: every admitted request adds work
to the same event loop and stretches every other request's time to first token. Refusing at the
door (before the body is read) with `Retry-After` lets clients and load balancers back off or go
elsewhere, and keeps the admitted requests' latency bounded.

One ASGI middleware; a request counts from the moment it is admitted until its response has
been sent in full (for a stream: its last chunk) or the client went away. The counter lives on the
event loop, so it needs no lock.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from kvgate.middleware.errors import Overloaded
from kvgate.middleware.server.responses import error_response

GATED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
RETRY_AFTER_S = 1  # in-flight requests finish within seconds; a retry a second later may get in

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]


class AdmissionGate:
    """Refuses (429, OpenAI error JSON, `Retry-After`) chat completions beyond `limit` in flight."""

    def __init__(
        self, app: ASGIApp, limit: int, on_reject: Callable[[], None] | None = None, paths: frozenset[str] = GATED_PATHS
    ) -> None:
        self.app = app
        self.limit = limit
        self.in_flight = 0  # read by the in-flight gauge when scraped: nothing to do per request
        self.admitted = 0  # requests let in so far (the loop-lag watcher samples faster while it moves)
        self.paths = paths
        self._on_reject = on_reject or (lambda: None)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            self._on_reject()
            err = Overloaded(
                f"kvgate is at its limit of {self.limit} requests in flight (server.max_in_flight); retry after {RETRY_AFTER_S} s"
            )
            await error_response(err, {"retry-after": str(RETRY_AFTER_S)})(scope, receive, send)
            return
        self.in_flight += 1
        self.admitted += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
