"""The relay: proxy misses on OpenAI-compatible replicas, passed through as the replica's own bytes.

LiteLLM turns every streamed chunk into its response objects and back into JSON; for a replica
that already speaks OpenAI's format (vLLM, SGLang, our replicas) that work buys nothing. The relay
sends the request with one pooled HTTP client (kvgate.middleware.forward.http1) and hands the replica's SSE events to the client
as they arrive, parsing only what the cache and the router need: the first content token
(`Router.first_token`), the text and finish reason (the stored answer, approximate mode's
`record_answers`), the usage, and error events. A non-streamed answer goes through as the
replica's JSON body.

Failover is the LiteLLM path's (kvgate.middleware.forward.failover): a connection error, timeout, 408/429
or 5xx before the first event moves the request to the next replica; a stream that breaks later is
re-issued and resumed where the client is when the request is greedy (kvgate.middleware.forward.resume),
otherwise it ends with an in-band error event. Usage: a streamed request is sent with
`stream_options.include_usage` so the stored answer carries the replica's own counts; the
usage-only chunk is dropped on its way to a client that did not ask for it.

Only the proxy uses the relay; the SDK face and routes whose provider needs translation stay on
LiteLLM (`routing.forward: litellm` turns it off for a route).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, ClassVar

import orjson

from kvgate.middleware.answers import answer_text, json_bytes
from kvgate.middleware.config import BackendConfig
from kvgate.middleware.forward.failover import Attempts, Failover
from kvgate.middleware.forward.forwarded import Forwarded
from kvgate.middleware.forward.http1 import Pool, Response
from kvgate.middleware.forward.relay_events import ReplicaError, SseParser
from kvgate.middleware.forward.resume import Diverged
from kvgate.middleware.request import RequestView

# LiteLLM providers whose wire format is OpenAI's own: `openai/<served name>` sends `<served name>`.
OPENAI_COMPATIBLE = frozenset({"openai", "hosted_vllm", "custom_openai", "openai_like"})
# where LiteLLM looks for a provider's key when its call names none
KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "custom_openai": "OPENAI_API_KEY", "hosted_vllm": "HOSTED_VLLM_API_KEY"}
# Idle pooled connections are dropped before uvicorn-based replicas (vLLM, ours) drop them (5 s).
KEEPALIVE_S = 3.0
# headers the relay writes itself (the body's framing, the replica's key): a caller's are dropped
_OURS = (("content-type", "application/json"), ("accept-encoding", "identity"))  # on every request
OWN_HEADERS = frozenset(
    {"content-type", "content-length", "transfer-encoding", "host", "connection", "accept-encoding", "authorization"}
)


def wire_model(model: str) -> str | None:
    """The model name an OpenAI-compatible replica is sent for a LiteLLM model string, or None
    when the provider is not one the relay can speak for."""
    provider, _, name = model.partition("/")
    return name if name and provider in OPENAI_COMPATIBLE else None


def env_key(model: str | None) -> str | None:
    """The key LiteLLM would send for this model string when the config names none: its
    provider's environment variable (read, never set)."""
    provider = (model or "").partition("/")[0]
    name = KEY_VARIABLES.get(provider)
    return os.environ.get(name) if name is not None else None


def _replica_error(status: int, body: bytes) -> ReplicaError:
    """The error a replica's non-2xx answer stands for, with its own message when it gave one."""
    try:
        error = orjson.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    text = message if isinstance(message, str) and message else body[:200].decode(errors="replace")
    return ReplicaError(f"replica answered {status}: {text}", status)


Request = tuple[bytes, dict[str, str], float, str]  # body, headers, timeout, path: the same on every replica


@dataclass(eq=False)
class Relayed(Forwarded):
    """A relayed call that has answered: a JSON body (`reply`), or an open stream and its first events."""

    raw: ClassVar[bool] = True
    request: Request = field(kw_only=True)
    parsed: dict[str, Any] | None = None  # the JSON body, read
    parser: SseParser | None = None
    head: bytes = b""  # the first events, already read (the client's headers wait for them)
    response: Response | None = None
    chunks: AsyncIterator[bytes] | None = None

    @property
    def text(self) -> str | None:
        if self.parser is not None:
            return self.parser.resume.sent_text
        return answer_text(self.parsed) if self.parsed is not None else None

    def payload(self) -> dict[str, Any] | None:
        """May rebuild tool calls (LiteLLM's builder) from a stream's chunks."""
        return self.parser.answer(self.view.messages) if self.parser is not None else self.parsed

    @property
    def usage(self) -> Any:
        if self.parser is not None:
            return self.parser.usage
        return self.parsed.get("usage") if self.parsed is not None else None

    @property
    def ended(self) -> bool:
        return self.parser is not None and self.parser.done

    async def close(self) -> None:
        """Release the replica's answer (one not read to its end closes its connection)."""
        response, self.response = self.response, None
        if response is not None:
            response.close()


class Relay:
    """One pooled HTTP transport for every route's replicas (made in, and closed with, the loop that
    uses it: the proxy's)."""

    def __init__(self) -> None:
        self._client: Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def client(self) -> Pool:
        """The pool of this loop (connections belong to the loop that made them). `timeout` of a
        request bounds its connect and every wait for the replica's next bytes."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client, self._loop = Pool(KEEPALIVE_S), loop
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()

    # -------------------------------------------------------------- calls
    @staticmethod
    def base(backend: BackendConfig, routed: bool) -> dict[str, Any]:
        """The arguments every attempt shares (`routed`: a router adds each replica's own)."""
        if not routed:  # the route's one backend (Failover hands back `base` as the attempt)
            return {"api_key": backend.api_key or env_key(backend.model) or "none", "api_base": backend.api_base}
        return {"api_key": backend.api_key} if backend.api_key else {}

    @staticmethod
    def request(view: RequestView, model: str, salt: str | None, timeout: float) -> Request:
        """What every replica is sent for this request (`salt`: the plan's engine cache_salt)."""
        body = _body(view, model, _options(view))
        if salt is not None:
            body["cache_salt"] = salt  # the tenant's, never the client's alone (routing.salt)
        path = "/completions" if view.completions else "/chat/completions"
        return json_bytes(body), _headers(view), timeout, path

    async def open(self, view: RequestView, attempts: Attempts, request: Request, attempt: dict[str, Any]) -> Relayed:
        """One attempt (Failover.answer drives them): send `request` to `attempt`'s replica and
        read its JSON body, or a stream's first event. Raises what the replica did wrong."""
        relayed = Relayed(view, attempts, request=request, sent_at=time.perf_counter())
        try:
            if view.stream:
                relayed.parser = SseParser(not _options(view).get("include_usage"), completions=view.completions)
                await self._start(relayed, attempt)
            else:
                relayed.reply, relayed.parsed = await self._post(request, attempt)
                relayed.ok = True
            relayed.first_at = time.perf_counter()
            return relayed
        except Exception:
            await relayed.close()
            raise

    async def stream(self, failover: Failover, relayed: Relayed) -> AsyncIterator[bytes]:
        """The stream's bytes for the client, from its first events on; a replica that breaks
        mid-stream is replaced (greedy requests: Failover.resume) or the stream ends with an
        in-band error event. `relayed.ok` says whether it reached its end; [DONE] is the caller's
        to send, after recording the answer."""
        parser, attempts = relayed.parser, relayed.attempts
        assert parser is not None
        told = parser.first_seen  # the router heard of the first token
        try:
            if told:
                failover.first_token(attempts)
            if relayed.head:
                yield relayed.head
            while True:
                try:
                    assert relayed.chunks is not None
                    async for data in relayed.chunks:
                        out = parser.feed(data)
                        if not told and parser.first_seen:
                            told = True
                            failover.first_token(attempts)
                        if out:
                            yield out
                    break
                except Diverged:
                    raise
                except Exception as exc:  # re-raises when it cannot go on
                    await failover.resume(relayed.view, attempts, parser.resume, exc, self._reissue, relayed)
            relayed.ok = True
        except Exception as exc:
            yield failover.error(exc).sse()
        finally:
            await relayed.close()

    async def _reissue(self, relayed: Relayed, attempt: dict[str, Any]) -> None:
        """The broken stream's request again, on `attempt`'s replica (its bytes resume after what
        the client has)."""
        await relayed.close()
        assert relayed.parser is not None
        relayed.parser.restart()
        await self._start(relayed, attempt, first=False)

    async def _post(self, request: Request, attempt: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        response = await self._send(request, attempt)
        try:
            content = await response.read()
        finally:
            response.close()
        if response.status >= 400:
            raise _replica_error(response.status, content)
        try:
            payload = orjson.loads(content)
        except orjson.JSONDecodeError:
            payload = None
        if not isinstance(payload, dict):
            raise ReplicaError("replica answered with a body that is not a JSON object")
        return content, payload

    async def _start(self, relayed: Relayed, attempt: dict[str, Any], first: bool = True) -> None:
        """Open the stream on `attempt`'s replica; with `first`, read on to its first event."""
        response = await self._send(relayed.request, attempt)
        relayed.response = response
        if response.status >= 400:
            raise _replica_error(response.status, await response.read())
        relayed.chunks = response.chunks()
        if not first:
            return
        parser, head = relayed.parser, []
        assert parser is not None
        while parser.events == 0:
            try:
                data = await relayed.chunks.__anext__()
            except StopAsyncIteration:
                break
            head.append(parser.feed(data))
        relayed.head = b"".join(head)

    async def _send(self, request: Request, attempt: dict[str, Any]) -> Response:
        body, headers, timeout, path = request
        return await self.client().post(
            f"{attempt['api_base'].rstrip('/')}{path}",
            body,
            {**headers, "authorization": f"Bearer {attempt['api_key']}"},
            timeout,
        )


def _options(view: RequestView) -> dict[str, Any]:
    options = view.forwarded.get("stream_options")
    return options if isinstance(options, dict) else {}


def _body(view: RequestView, model: str, options: dict[str, Any]) -> dict[str, Any]:
    """The request as the replica gets it: the output-affecting parameters, the messages, and the
    OpenAI fields we forward (never kvgate's or LiteLLM's own)."""
    prompt = view.prompt
    if prompt is not None:  # a completions request: its one prompt, as the client sent it
        body = {**view.params, "model": model, "prompt": prompt.wire}
    else:
        body = {**view.params, "model": model, "messages": view.messages}
    if view.stream:
        body["stream"] = True
        body["stream_options"] = {**options, "include_usage": True}
    if view.forwarded.get("user") is not None:
        body["user"] = view.forwarded["user"]
    return body


def _headers(view: RequestView) -> dict[str, str]:
    """The caller's extra headers (as LiteLLM passes them on), then ours; never framing headers."""
    if not view.forwarded:  # the usual request forwards none of them
        return dict(_OURS)
    headers = {}
    for key in ("extra_headers", "headers"):
        extra = view.forwarded.get(key)
        if isinstance(extra, dict):
            headers.update({str(k): str(v) for k, v in extra.items() if str(k).lower() not in OWN_HEADERS})
    headers.update(_OURS)
    return headers
