"""The relay: proxy misses on OpenAI-compatible replicas, passed through as the replica's own bytes.

LiteLLM turns every streamed chunk into its response objects and back into JSON; for a replica
that already speaks OpenAI's format (vLLM, SGLang, our replicas) that work buys nothing. The relay
sends the request with one pooled HTTP client (aiohttp, see `Transport`) and hands the replica's SSE events to the client
as they arrive, parsing only what the cache and the router need: the first content token
(`Router.first_token`), the text and finish reason (the stored answer, approximate mode's
`record_answers`), the usage, and error events. A non-streamed answer goes through as the
replica's JSON body.

Failover is the LiteLLM path's (middleware.backend): a connection error, timeout, 408/429 or 5xx
before the first event moves the request to the next replica; a stream that breaks later is
re-issued and resumed where the client is when the request is greedy (middleware.resume),
otherwise it ends with an in-band error event. Usage: a streamed request is sent with
`stream_options.include_usage` so the stored answer carries the replica's own counts; the
usage-only chunk is dropped on its way to a client that did not ask for it.

Only the proxy uses the relay; the SDK face and routes whose provider needs translation stay on
LiteLLM (`routing.forward: litellm` turns it off for a route).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import aiohttp
import orjson

from middleware.answers import assemble
from middleware.backend import Backend, Call
from middleware.request import RequestView
from middleware.resume import Diverged, StreamResume

log = logging.getLogger("kvgate.relay")
# LiteLLM providers whose wire format is OpenAI's own: `openai/<served name>` sends `<served name>`.
OPENAI_COMPATIBLE = frozenset({"openai", "hosted_vllm", "custom_openai", "openai_like"})
# Idle pooled connections are dropped before uvicorn-based replicas (vLLM, ours) drop them (5 s).
KEEPALIVE_S = 3.0
DONE = b"data: [DONE]\n\n"


def wire_model(model: str) -> str | None:
    """The model name an OpenAI-compatible replica is sent for a LiteLLM model string, or None
    when the provider is not one the relay can speak for."""
    provider, _, name = model.partition("/")
    return name if name and provider in OPENAI_COMPATIBLE else None


class ReplicaError(Exception):
    """A replica answered with an error (status_code None: no usable HTTP status)."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code


def _replica_error(status: int, body: bytes) -> ReplicaError:
    """The error a replica's non-2xx answer stands for, with its own message when it gave one."""
    try:
        error = orjson.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    text = message if isinstance(message, str) and message else body[:200].decode(errors="replace")
    return ReplicaError(f"replica answered {status}: {text}", status)


class SseParser:
    """Follows one client stream through the replica's SSE bytes: cuts them into events, reads each
    event's JSON once and says which bytes go on to the client (as they came, unless a resumed
    stream's chunk had to be trimmed). [DONE] is held back (the pipeline sends it after storing)."""

    def __init__(self, strip_usage: bool, on_first: Callable[[], None]) -> None:
        self.resume = StreamResume()  # also keeps choice 0's text: the answer
        self.chunks: list[dict[str, Any]] = []  # as sent to the client (for the rare non-plain answer)
        self.usage: dict[str, Any] | None = None
        self.finish: str | None = None
        self.role: str | None = None
        self.plain = True  # one choice, text only, no logprobs: the answer is built without LiteLLM
        self.events = 0
        self._strip_usage = strip_usage
        self._on_first = on_first
        self._first_seen = False
        self._buffer = b""
        self._sep: bytes | None = None

    def restart(self) -> None:
        """A re-issued stream begins (after StreamResume.restart): drop the dead one's partial event."""
        self._buffer = b""

    def feed(self, data: bytes) -> bytes:
        """Bytes read from the replica → the bytes to send on (b"" while an event is incomplete)."""
        buffer = self._buffer + data if self._buffer else data
        if self._sep is None:
            newline = buffer.find(b"\n")
            if newline < 0:
                self._buffer = buffer
                return b""
            self._sep = b"\r\n\r\n" if newline and buffer[newline - 1:newline] == b"\r" else b"\n\n"
        sep, out, start = self._sep, [], 0
        while (end := buffer.find(sep, start)) >= 0:
            kept = self._event(buffer[start:end + len(sep)])
            start = end + len(sep)
            if kept:
                out.append(kept)
        self._buffer = buffer[start:]
        return b"".join(out)

    def _event(self, event: bytes) -> bytes | None:
        data = _data(event)
        if data is None:  # a comment (keep-alive) or a field we do not read: passed on as is
            return event
        if data == b"[DONE]":
            return None
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ReplicaError("replica sent a stream event that is not JSON") from None
        if not isinstance(chunk, dict):
            raise ReplicaError("replica sent a stream event that is not a JSON object")
        if "error" in chunk:  # vLLM / SGLang report a failure inside the stream
            error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            code = error.get("code")
            raise ReplicaError(f"replica failed mid-stream: {error.get('message')}", code if isinstance(code, int) else None)
        self.events += 1
        resumed = self.resume.resumes > 0
        if resumed:
            chunk = self.resume.trim(chunk)  # Diverged when the retry says something else
            if chunk is None:
                return None
        else:
            self.resume.sent(chunk)
        self.chunks.append(chunk)
        rewrite = resumed
        usage = chunk.get("usage")
        if usage:
            self.usage = usage
            if self._strip_usage:  # we asked for it; the client did not
                if not chunk.get("choices"):
                    return None
                chunk = {k: v for k, v in chunk.items() if k != "usage"}
                rewrite = True
        self._read_choices(chunk.get("choices") or [])
        return b"data: " + orjson.dumps(chunk) + self._sep if rewrite else event  # type: ignore[operator]

    def _read_choices(self, choices: list[Any]) -> None:
        if not choices:
            return
        first = choices[0]
        if len(choices) > 1 or not isinstance(first, dict) or first.get("logprobs"):
            self.plain = False
            return
        delta = first.get("delta") or {}
        finish = first.get("finish_reason")
        if finish:
            self.finish = finish
        if self.role is None and delta.get("role"):
            self.role = delta["role"]
        if not self._first_seen and (delta.get("content") or delta.get("tool_calls") or finish):
            self._first_seen = True
            self._on_first()

    def answer(self, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The full answer as a `chat.completion` dict, for the cache; None when the stream did
        not finish (no finish reason) or cannot be rebuilt."""
        if not self.chunks:
            return None
        if not (self.plain and self.resume.spliceable):  # tool calls, several choices…: LiteLLM's builder
            from litellm.types.utils import ModelResponseStream

            return assemble([ModelResponseStream(**c) for c in self.chunks], messages)
        if self.finish is None:
            return None
        head = self.chunks[0]
        answer: dict[str, Any] = {
            "id": self.resume.stream_id or head.get("id"), "object": "chat.completion",
            "created": head.get("created"), "model": head.get("model"),
            "choices": [{"index": 0, "message": {"role": self.role or "assistant", "content": self.resume.sent_text},
                         "finish_reason": self.finish}],
        }
        if head.get("system_fingerprint"):
            answer["system_fingerprint"] = head["system_fingerprint"]
        if self.usage:
            answer["usage"] = self.usage
        return answer


def _data(event: bytes) -> bytes | None:
    """The data of one SSE event (its `data:` lines joined), None when it has none."""
    if event.startswith(b"data:") and event.count(b"\n") <= 2:  # the usual one-line event
        return event[5:].strip()
    lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


class Transport:
    """The relay's HTTP client: one aiohttp session, connections pooled per replica.

    aiohttp rather than httpx: httpcore's pool scans every pooled connection (a select() on each
    idle one) whenever a request is added or removed, so its cost grows with the concurrency; on
    the all-miss load of `kvgate bench throughput` the relay made 1.6x (32 clients) to 2x (128)
    the requests/s on aiohttp than on httpx (docs/BENCHMARKS.md). LiteLLM sends on aiohttp too."""

    def __init__(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",))

    async def send(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> aiohttp.ClientResponse:
        """POST `body`; `timeout` bounds the connect and every wait for the next bytes. A response
        read to its end gives its connection back to the pool by itself; `close()` drops one that
        was not (a stream the client walked away from)."""
        limits = aiohttp.ClientTimeout(total=None, connect=timeout, sock_connect=timeout, sock_read=timeout)
        try:
            response = await self.session.post(url, data=body, headers=headers, timeout=limits)
        except aiohttp.ServerDisconnectedError:  # a pooled connection the replica had just closed: once more
            response = await self.session.post(url, data=body, headers=headers, timeout=limits)
        return response

    async def aclose(self) -> None:
        await self.session.close()


@dataclass
class Relayed:
    """A relayed call that has answered: a JSON body, or an open stream and its first events."""

    call: Call  # ticket (follows the replica now answering), plan and replicas tried: failover state
    body: bytes | None = None
    payload: dict[str, Any] | None = None
    parser: SseParser | None = None
    head: bytes = b""  # the first events, already read (the client's headers wait for them)
    response: aiohttp.ClientResponse | None = None
    chunks: AsyncIterator[bytes] | None = None
    ok: bool = False  # the stream reached its end
    request: tuple[bytes, dict[str, str], float] = field(default=(b"", {}, 0.0))

    @property
    def text(self) -> str:
        return self.parser.resume.sent_text if self.parser is not None else ""

    def answer(self, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
        return self.parser.answer(messages) if self.parser is not None else self.payload

    async def close(self) -> None:
        """Release the replica's answer (one not read to its end closes its connection)."""
        response, self.response = self.response, None
        if response is not None:
            response.close()


class Relay:
    """One pooled HTTP transport for every route's replicas (made in, and closed with, the loop that
    uses it: the proxy's)."""

    def __init__(self) -> None:
        self._client: Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def model_for(self, backend: Backend, view: RequestView) -> str | None:
        """The wire model when this request can be relayed, else None (LiteLLM takes it)."""
        if backend.router is None or backend.route.routing.forward != "relay":
            return None
        return wire_model(backend.model_for(view))

    def client(self) -> Transport:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client, self._loop = Transport(), loop
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.aclose()

    # -------------------------------------------------------------- calls
    async def open(self, backend: Backend, view: RequestView, model: str) -> Relayed:
        """Send the request to the best replica, failing over until one answers (a JSON body, or a
        stream's first event). Raises BackendError when none does."""
        cfg = backend.route.backend
        options = view.forwarded.get("stream_options")
        options = options if isinstance(options, dict) else {}
        request = (orjson.dumps(_body(view, model, options)), _headers(view), cfg.timeout)
        base = {"api_key": cfg.api_key} if cfg.api_key else {}
        # the LiteLLM path's failover bookkeeping (middleware.backend), shared
        call = Call(plan=backend._plan(view), tried=set(), kwargs=base)
        while True:
            attempt, call.ticket = backend._attempt(view, call.plan, call.tried, base)
            relayed = Relayed(call, request=request)
            try:
                if view.stream:
                    relayed.parser = SseParser(not options.get("include_usage"), self._on_first(backend, call))
                    await self._start(relayed, attempt)
                else:
                    relayed.body, relayed.payload = await self._post(request, attempt)
                return relayed
            except Exception as exc:  # connection errors, timeouts, error statuses, bad bodies
                await relayed.close()
                if not backend._failed(view, call.ticket, exc, call.tried):
                    raise backend.error(exc) from exc

    async def stream(self, backend: Backend, view: RequestView, relayed: Relayed) -> AsyncIterator[bytes]:
        """The stream's bytes for the client, from its first events on; a replica that breaks
        mid-stream is replaced (greedy requests) or the stream ends with an in-band error event.
        `relayed.ok` says whether it reached its end. [DONE] is the caller's to send."""
        parser, call = relayed.parser, relayed.call
        assert parser is not None
        try:
            if relayed.head:
                yield relayed.head
            while True:
                try:
                    assert relayed.chunks is not None
                    async for data in relayed.chunks:
                        out = parser.feed(data)
                        if out:
                            yield out
                    break
                except Diverged:
                    raise
                except Exception as exc:
                    backend._resume_or_raise(view, call, parser.resume, exc)  # re-raises when it cannot go on
                    await relayed.close()
                    parser.restart()
                    try:
                        await self._start(relayed, backend._reissue(view, call), first=False)
                    except Exception as again:  # the new replica failed at once: booked on the next turn
                        relayed.chunks = _araise(again)
            relayed.ok = True
        except Exception as exc:
            yield b"data: " + orjson.dumps(backend.error(exc).to_json()) + b"\n\n"
        finally:
            await relayed.close()

    async def _post(self, request: tuple[bytes, dict[str, str], float],
                    attempt: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
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
        relayed.chunks = response.content.iter_any().__aiter__()
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

    async def _send(self, request: tuple[bytes, dict[str, str], float], attempt: dict[str, Any]) -> aiohttp.ClientResponse:
        body, headers, timeout = request
        return await self.client().send(f"{attempt['api_base'].rstrip('/')}/chat/completions", body,
                                        {**headers, "authorization": f"Bearer {attempt['api_key']}"}, timeout)

    @staticmethod
    def _on_first(backend: Backend, call: Call) -> Callable[[], None]:
        def first() -> None:
            if call.ticket is not None and backend.router is not None:
                backend.router.first_token(call.ticket)
        return first


def _body(view: RequestView, model: str, options: dict[str, Any]) -> dict[str, Any]:
    """The request as the replica gets it: the output-affecting parameters, the messages, and the
    OpenAI fields we forward (never kvgate's or LiteLLM's own)."""
    body = {**view.params, "model": model, "messages": view.messages}
    if view.stream:
        body["stream"] = True
        body["stream_options"] = {**options, "include_usage": True}
    if view.forwarded.get("user") is not None:
        body["user"] = view.forwarded["user"]
    return body


def _headers(view: RequestView) -> dict[str, str]:
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    for key in ("extra_headers", "headers"):
        extra = view.forwarded.get(key)
        if isinstance(extra, dict):
            headers.update({str(k): str(v) for k, v in extra.items()})
    return headers


async def _araise(exc: Exception) -> AsyncIterator[bytes]:
    """A stream that fails at once with `exc` (so a re-issue failure goes through the same path)."""
    raise exc
    yield  # pragma: no cover
