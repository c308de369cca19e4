"""The LiteLLM call of a route: one backend, or replicas behind a Router with failover.

Failover rule: a connection error, timeout or 5xx marks the replica down (circuit open for
`routing.down_for_s`, then half-open) and the request moves to the next best replica, up to
`routing.max_attempts` replicas. A 4xx is the caller's problem and is returned as is. Streams fail
over before their first chunk; a stream that breaks after it is re-issued on another replica and
resumed where the client is (middleware.resume) when the request is greedy, else it ends with an
in-band error.

Timeouts: `backend.timeout` bounds every wait on a replica (connect, time to the first byte of
a non-streamed answer, the gap between two stream chunks); a replica that exceeds it counts as
failed like a dead one. `backend.num_retries` retries the same server inside LiteLLM (0 by
default: on routes with replicas, another replica is the better retry).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator

import litellm

from middleware.config import RouteConfig
from middleware.errors import BackendError
from middleware.metrics import Metrics
from middleware.request import RequestView
from middleware.resume import Diverged, StreamResume, resumable
from middleware.routing.router import Router, Ticket

log = logging.getLogger("kvgate.backend")


@dataclass
class Call:
    """A backend call that has answered: a full response, or a stream's first chunk and the rest."""

    response: Any = None
    first: Any = None
    rest: Any = None
    ticket: Ticket | None = None
    # what a mid-stream failover needs: the routing plan, replicas tried, the call's arguments
    plan: Any = None
    tried: set[str] | None = None
    kwargs: dict[str, Any] | None = None

    @property
    def replica(self) -> str | None:
        return self.ticket.replica.name if self.ticket else None


def status_of(exc: Exception) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def retryable(exc: Exception) -> bool:
    """Connection errors (no HTTP status), timeouts (LiteLLM's Timeout says 408), 429 and 5xx may
    succeed elsewhere."""
    status = status_of(exc)
    return status is None or status in (408, 429) or status >= 500


def error_message(exc: Exception) -> str:
    return getattr(exc, "message", None) or str(exc) or type(exc).__name__


class Backend:
    def __init__(self, route: RouteConfig, router: Router | None = None, metrics: Metrics | None = None) -> None:
        self.route = route
        self.router = router
        self.metrics = metrics

    def model_for(self, view: RequestView) -> str:
        """The LiteLLM model string a miss is sent as (also what its price is looked up by)."""
        return self.route.backend.model or view.model

    def kwargs(self, view: RequestView) -> dict[str, Any]:
        backend = self.route.backend
        kwargs: dict[str, Any] = {
            **view.params,
            **view.forwarded,
            "model": self.model_for(view),
            "messages": view.messages,
            "stream": view.stream,
            "timeout": backend.timeout,
            "num_retries": backend.num_retries,
        }
        if backend.api_base:
            kwargs["api_base"] = backend.api_base
        if backend.api_key:
            kwargs["api_key"] = backend.api_key
        salt = self.salt(view)
        if salt is not None:  # a client's own salt reaches the engine only folded into the tenant's
            kwargs.pop("cache_salt", None)
            kwargs["extra_body"] = {**(kwargs.get("extra_body") or {}), "cache_salt": salt}
        if view.params.get("tools"):
            # LiteLLM checks every request with tools for its MCP gateway, which imports the
            # optional `mcp` package: without this, a tools request fails before leaving.
            kwargs["_skip_mcp_handler"] = True
        return kwargs

    # -------------------------------------------------------------- attempts
    def _attempt(self, view: RequestView, plan: Any, tried: set[str], call: dict[str, Any]) -> tuple[dict[str, Any], Ticket | None]:
        if self.router is None:
            return call, None
        replica = self.router.choose(plan, tried)
        if replica is None:
            raise BackendError(f"no replica left to try on route {self.route.name!r}")
        tried.add(replica.name)
        ticket = self.router.started(replica, plan)
        attempt = {**call, "api_base": replica.api_base}
        if replica.api_key:
            attempt["api_key"] = replica.api_key
        attempt.setdefault("api_key", "none")  # openai-compatible servers behind us may need none
        return attempt, ticket

    def _failed(self, view: RequestView, ticket: Ticket | None, exc: Exception, tried: set[str],
                when: str = "before_first_byte") -> bool:
        """Book the failure; True when another replica should be tried."""
        if ticket is None or self.router is None:
            return False
        self.router.finished(ticket, ok=False)
        if not retryable(exc):
            return False
        if status_of(exc) != 429:
            self.router.mark_down(ticket.replica, error_message(exc))
        more = len(tried) < min(self.router.cfg.max_attempts, len(self.router.replicas))
        if more:
            log.info("route %s: retrying on another replica after %s failed", self.route.name, ticket.replica.name)
            if self.metrics is not None:
                self.metrics.failovers.labels(self.route.name, when).inc()
        return more

    def salt(self, view: RequestView) -> str | None:
        """The engine's cache_salt for this request (middleware.routing.salt), or None."""
        if self.router is None:
            return None
        return self.router.salt(view.tenant if self.route.scope == "tenant" else None, view.params.get("cache_salt"))

    def _plan(self, view: RequestView) -> Any:
        if self.router is None:
            return None
        user = view.forwarded.get("user")
        return self.router.plan(view.messages, session=user if isinstance(user, str) else None, salt=self.salt(view))

    async def acall(self, view: RequestView) -> Call:
        plan, tried, base = self._plan(view), set(), self.kwargs(view)
        while True:
            kwargs, ticket = self._attempt(view, plan, tried, base)
            try:
                response = await litellm.acompletion(**kwargs)
                if not view.stream:
                    return Call(response=response, ticket=ticket)
                rest = response.__aiter__()
                try:
                    first = await rest.__anext__()
                except StopAsyncIteration:
                    first = None
                return self._first(Call(first=first, rest=rest, ticket=ticket, plan=plan, tried=tried, kwargs=base))
            except Exception as exc:  # litellm raises many types; all mean "the backend failed"
                if not self._failed(view, ticket, exc, tried):
                    raise self.error(exc) from exc

    # -------------------------------------------------------------- streams
    async def astream(self, view: RequestView, call: Call) -> AsyncIterator[Any]:
        """The chunks of a streamed answer. A replica that fails mid-stream is replaced: the
        request is re-issued on another one and resumed after what the client already has
        (greedy requests only); `call.ticket` follows the replica now streaming. Closing this
        generator closes the replica's stream, so a client that goes away stops its generation."""
        resume = StreamResume()
        try:
            if call.first is not None:
                yield resume.sent(call.first)
            while True:
                try:
                    async for chunk in call.rest:
                        out = resume.trim(chunk)
                        if out is not None:
                            yield out
                    return
                except Diverged:
                    raise
                except Exception as exc:
                    self._resume_or_raise(view, call, resume, exc)
                    await _aclose(call.rest)
                    try:
                        response = await litellm.acompletion(**self._reissue(view, call))
                        call.rest = response.__aiter__()
                    except Exception as again:  # the new replica failed at once: book it and go on
                        call.rest = _araise(again)
        finally:
            await _aclose(call.rest)

    def _resume_or_raise(self, view: RequestView, call: Call, resume: StreamResume, exc: Exception) -> None:
        """Book a mid-stream failure; return when the stream can go on elsewhere, else re-raise."""
        if call.ticket is None or call.tried is None or not resume.spliceable or not resumable(view.params):
            raise exc
        more = self._failed(view, call.ticket, exc, call.tried, "mid_stream")
        call.ticket = None  # booked as failed (by _failed); a new attempt gets its own ticket
        if not more:
            raise exc
        resume.restart()
        log.info("route %s: stream broke after %d characters; resuming on another replica", self.route.name,
                 len(resume.sent_text))

    def _reissue(self, view: RequestView, call: Call) -> dict[str, Any]:
        """Arguments for the same request on the next replica; `call.ticket` becomes its ticket."""
        assert call.kwargs is not None and call.tried is not None
        kwargs, call.ticket = self._attempt(view, call.plan, call.tried, call.kwargs)
        if call.ticket is not None and self.router is not None:
            self.router.first_token(call.ticket)  # its prefill is no longer queued work we wait on
        return kwargs

    def _first(self, call: Call) -> Call:
        if call.ticket is not None and self.router is not None:
            self.router.first_token(call.ticket)
        return call

    def done(self, call: Call, ok: bool, view: RequestView, answer: str | None = None) -> None:
        """The answer is complete (or abandoned); tell the router what the replica now holds."""
        if call.ticket is None or self.router is None:
            return
        conversation = None
        if ok and answer is not None:
            conversation = [*view.messages, {"role": "assistant", "content": answer}]
        self.router.finished(call.ticket, ok, conversation)

    def error(self, exc: Exception) -> BackendError:
        message = error_message(exc)
        log.warning("backend for route %s failed: %s", self.route.name, message)
        return BackendError(f"backend error on route {self.route.name!r}: {message}", backend_status=status_of(exc))


async def _araise(exc: Exception) -> AsyncIterator[Any]:
    """A stream that fails at once with `exc` (so a re-issue failure goes through the same path)."""
    raise exc
    yield  # pragma: no cover


async def _aclose(stream: Any) -> None:
    """Close a backend stream (LiteLLM's wrapper releases its HTTP connection); never raises."""
    close = getattr(stream, "aclose", None)
    if close is None:
        return
    try:
        await close()
    except Exception as exc:  # a stream that cannot close cleanly is already gone
        log.debug("closing a backend stream failed: %s", exc)
