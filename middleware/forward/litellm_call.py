"""The LiteLLM transport of a route's misses: one backend, or replicas behind a Router.

Failover is kvgate.middleware.forward.failover's, shared with the relay. Timeouts: `backend.timeout`
bounds every wait on a replica (connect, time to the first byte of a non-streamed answer, the gap
between two stream chunks); a replica that exceeds it counts as failed like a dead one.
`backend.num_retries` retries the same server inside LiteLLM (0 by default: on routes with
replicas, another replica is the better retry); the relay honours it for a route's one backend
(kvgate.middleware.forward.failover).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from kvgate.middleware.answers import answer_text, assemble, streamed_text
from kvgate.middleware.config import RouteConfig
from kvgate.middleware.forward.failover import Attempts, Failover
from kvgate.middleware.forward.forwarded import Forwarded
from kvgate.middleware.forward.resume import Diverged, StreamResume
from kvgate.middleware.litellm_env import litellm
from kvgate.middleware.request import RequestView
from kvgate.middleware.text_answers import streamed_text_answer

log = logging.getLogger("kvgate.forward")


@dataclass(eq=False)
class Call(Forwarded):
    """A LiteLLM call that has answered: a full response (`reply`), or a stream's first chunk and
    the rest."""

    first: Any = None  # litellm's first ModelResponseStream chunk, or None for an empty stream
    rest: AsyncIterator[Any] | None = None
    chunks: list[Any] = field(default_factory=list)  # a stream's, as sent to the caller
    parsed: dict[str, Any] | None = None  # the response as a dict, once asked for

    @property
    def text(self) -> str | None:
        if self.view.stream:
            return streamed_text(self.chunks)
        payload = self.payload()
        return answer_text(payload) if payload is not None else None

    def payload(self) -> dict[str, Any] | None:
        """A stream's is assembled here (LiteLLM may count prompt tokens while it does)."""
        if self.view.stream:
            return (
                streamed_text_answer(self.chunks)
                if self.view.completions
                else assemble(self.chunks, self.view.messages)
            )
        if self.parsed is None and self.reply is not None:
            self.parsed = self.reply.model_dump()
        return self.parsed


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

    async def send(self, view: RequestView, attempts: Attempts, kwargs: dict[str, Any]) -> Call:
        """One attempt (Failover.answer drives them): a response, or a stream's first chunk.
        LiteLLM raises many types; all mean "the backend failed"."""
        response = await _call(view, kwargs)
        if not view.stream:
            return Call(view, attempts, reply=response, ok=True)
        rest = response.__aiter__()
        try:
            first = await rest.__anext__()
        except StopAsyncIteration:
            first = None
        return Call(view, attempts, first=first, rest=rest)

    async def stream(self, call: Call) -> AsyncIterator[Any]:
        """The chunks of a streamed answer, kept in `call.chunks`; `call.ok` once it ended. A
        replica that fails mid-stream is replaced (Failover.resume): the request is re-issued on
        another one and resumed after what the client already has (greedy requests only);
        `call.attempts.ticket` follows the replica now streaming. Raises BackendError when the
        stream cannot go on. Closing this generator closes the replica's stream, so a client that
        goes away stops its generation."""
        resume, chunks = StreamResume(), call.chunks
        try:
            if call.first is not None:
                chunks.append(resume.sent(call.first))
                yield chunks[-1]
            while True:
                try:
                    assert call.rest is not None
                    async for chunk in call.rest:
                        out = resume.trim(chunk)
                        if out is not None:
                            chunks.append(out)
                            yield out
                    break
                except Diverged:
                    raise
                except Exception as exc:  # re-raises when it cannot go on
                    await self.failover.resume(call.view, call.attempts, resume, exc, self._reissue, call)
            call.ok = True
        except Exception as exc:
            raise self.failover.error(exc) from exc
        finally:
            await _aclose(call.rest)

    async def _reissue(self, call: Call, kwargs: dict[str, Any]) -> None:
        """The broken stream's request again, on another replica (resumed after what the client has)."""
        await _aclose(call.rest)
        call.rest = (await _call(call.view, kwargs)).__aiter__()


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
