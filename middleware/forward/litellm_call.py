"""The LiteLLM transport of a route's misses: one backend, or replicas behind a Router.

Failover is kvgate.middleware.forward.failover's, shared with the relay. Timeouts: `backend.timeout`
bounds every wait on a replica (connect, time to the first byte of a non-streamed answer, the gap
between two stream chunks); a replica that exceeds it counts as failed like a dead one.
`backend.num_retries` retries the same server inside LiteLLM (0 by default: on routes with
replicas, another replica is the better retry).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator

from kvgate.middleware.config import RouteConfig
from kvgate.middleware.forward.failover import Attempts, Failover, failing
from kvgate.middleware.forward.resume import Diverged, StreamResume
from kvgate.middleware.litellm_env import litellm
from kvgate.middleware.request import RequestView

log = logging.getLogger("kvgate.forward")


@dataclass
class Call:
    """A LiteLLM call that has answered: a full response, or a stream's first chunk and the rest."""

    attempts: Attempts
    response: Any = None  # litellm's ModelResponse (non-streamed)
    first: Any = None  # litellm's first ModelResponseStream chunk, or None for an empty stream
    rest: AsyncIterator[Any] | None = None


class LiteLLMCall:
    """Misses sent through `litellm.acompletion` / `atext_completion` (the SDK, and routes whose
    provider needs translation)."""

    def __init__(self, route: RouteConfig, failover: Failover) -> None:
        self.route = route
        self.failover = failover

    def kwargs(self, view: RequestView, model: str) -> dict[str, Any]:
        backend = self.route.backend
        kwargs: dict[str, Any] = {
            **view.params,
            **view.forwarded,
            "model": model,
            "stream": view.stream,
            "timeout": backend.timeout,
            "num_retries": backend.num_retries,
        }
        prompt = view.prompt
        if prompt is None:
            kwargs["messages"] = view.messages
        else:
            kwargs["prompt"] = prompt.wire
        if backend.api_base:
            kwargs["api_base"] = backend.api_base
        if backend.api_key:
            kwargs["api_key"] = backend.api_key
        salt = self.failover.salt(view)
        if salt is not None:  # a client's own salt reaches the engine only folded into the tenant's
            kwargs.pop("cache_salt", None)
            kwargs["extra_body"] = {**(kwargs.get("extra_body") or {}), "cache_salt": salt}
        if view.params.get("tools"):
            # LiteLLM checks every request with tools for its MCP gateway, which imports the
            # optional `mcp` package: without this, a tools request fails before leaving.
            kwargs["_skip_mcp_handler"] = True
        return kwargs

    async def open(self, view: RequestView, model: str) -> Call:
        """Send to the best replica, failing over until one answers (a response, or a stream's
        first chunk). Raises BackendError when none does."""
        attempts = self.failover.begin(view, self.kwargs(view, model))
        while True:
            kwargs = self.failover.next(attempts)
            try:
                response = await _call(view, kwargs)
                if not view.stream:
                    return Call(attempts, response=response)
                rest = response.__aiter__()
                try:
                    first = await rest.__anext__()
                except StopAsyncIteration:
                    first = None
                self.failover.first_token(attempts)
                return Call(attempts, first=first, rest=rest)
            except Exception as exc:  # litellm raises many types; all mean "the backend failed"
                if not self.failover.failed(attempts, exc):
                    raise self.failover.error(exc) from exc

    async def stream(self, view: RequestView, call: Call) -> AsyncIterator[Any]:
        """The chunks of a streamed answer. A replica that fails mid-stream is replaced: the
        request is re-issued on another one and resumed after what the client already has
        (greedy requests only); `call.attempts.ticket` follows the replica now streaming. Closing
        this generator closes the replica's stream, so a client that goes away stops its generation."""
        resume = StreamResume()
        try:
            if call.first is not None:
                yield resume.sent(call.first)
            while True:
                try:
                    assert call.rest is not None
                    async for chunk in call.rest:
                        out = resume.trim(chunk)
                        if out is not None:
                            yield out
                    return
                except Diverged:
                    raise
                except Exception as exc:
                    kwargs = self.failover.resume_or_raise(view, call.attempts, resume, exc)
                    await _aclose(call.rest)
                    try:
                        response = await _call(view, kwargs)
                        call.rest = response.__aiter__()
                    except Exception as again:  # the new replica failed at once: book it and go on
                        call.rest = failing(again)
        finally:
            await _aclose(call.rest)


async def _call(view: RequestView, kwargs: dict[str, Any]) -> Any:
    """`litellm.acompletion`, or `litellm.atext_completion` for a completions request."""
    if view.completions:
        return await litellm.atext_completion(**kwargs)
    return await litellm.acompletion(**kwargs)


async def _aclose(stream: Any) -> None:
    """Close a backend stream (LiteLLM's wrapper releases its HTTP connection); never raises."""
    close = getattr(stream, "aclose", None)
    if close is None:
        return
    try:
        await close()
    except Exception as exc:  # a stream that cannot close cleanly is already gone
        log.debug("closing a backend stream failed: %s", exc)
