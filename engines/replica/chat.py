"""One chat completion's way between the replica's HTTP handler and its engine (the worker thread
runs the model; the event loop only relays): the sampling parameters read from the request body, the
submission, and its events brought back to the loop, drained to a Completion (cancelled when the
client disconnects) or relayed as OpenAI's SSE chunks. kvgate.engines.replica.server routes to it."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, AsyncIterator

from fastapi import Request

from kvgate.engines.api import ChatCall, InvalidRequest, sse
from kvgate.engines.replica.metrics import ReplicaMetrics
from kvgate.engines.replica.types import Completion, Event, SamplingParams, Submission

if TYPE_CHECKING:  # the engine pulls in torch: a type only here, so `kvgate --help` stays quick
    from kvgate.engines.replica.engine import ReplicaEngine

DISCONNECT_POLL_S = 0.25


def _number(body: dict[str, Any], name: str) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidRequest(f"{name} must be a number", param=name)
    return float(v)


def parse_sampling(body: dict[str, Any], call: ChatCall) -> SamplingParams:
    """SamplingParams from a chat body already checked by kvgate.engines.api.parse_chat; raises InvalidRequest."""
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) for s in stop)):
        raise InvalidRequest("stop must be a string or a list of strings", param="stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidRequest("seed must be an integer", param="seed")
    n = body.get("n")
    if n is not None and n != 1:
        raise InvalidRequest("only n=1 is supported", param="n")
    top_p = _number(body, "top_p")
    params = SamplingParams(
        max_tokens=call.max_tokens,
        temperature=_number(body, "temperature"),
        top_p=1.0 if top_p is None else top_p,
        stop=tuple(stop or ()),
        seed=seed,
    )
    params.validate()
    return params


def submit(engine: ReplicaEngine, tokens: list[int], params: SamplingParams) -> tuple[Submission, asyncio.Queue[Event]]:
    """Queue a request; its events arrive on an asyncio queue of the running loop."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Event] = asyncio.Queue()

    def sink(ev: Event) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, ev)
        except RuntimeError:  # the loop is gone (server shutting down): nobody is listening
            pass

    return engine.submit(tokens, params, sink), events


async def finish_unless_gone(request: Request, submission: Submission, events: asyncio.Queue[Event]) -> Completion:
    """_finish, cancelling the generation if the client disconnects meanwhile (checked every
    DISCONNECT_POLL_S); a cancelled request still ends with its Completion."""
    done = asyncio.ensure_future(_finish(events))
    try:
        while not done.done():
            await asyncio.wait({done}, timeout=DISCONNECT_POLL_S)
            if not done.done() and await request.is_disconnected():
                submission.cancel()
        return done.result()
    finally:
        done.cancel()


async def _finish(events: asyncio.Queue[Event]) -> Completion:
    """Drain a request's events to its Completion (re-raising an engine error)."""
    while True:
        ev = await events.get()
        if isinstance(ev, BaseException):
            raise ev
        if not isinstance(ev, str):  # the Completion
            return ev


async def stream_chunks(
    submission: Submission,
    events: asyncio.Queue[Event],
    metrics: ReplicaMetrics,
    call: ChatCall,
    rid: str,
    created: int,
) -> AsyncIterator[bytes]:
    """A streamed request's events as OpenAI's SSE chunks, ending with `data: [DONE]` (an engine
    error ends the stream with an error event)."""
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": call.model}
    first = True
    try:
        while True:
            ev = await events.get()
            if isinstance(ev, BaseException):
                metrics.requests.labels(outcome="failed").inc()
                yield sse(
                    {
                        "error": {
                            "message": f"generation failed: {ev}",
                            "type": "internal_error",
                            "param": None,
                            "code": None,
                        }
                    }
                )
                yield b"data: [DONE]\n\n"
                return
            if not isinstance(ev, str):  # the Completion
                break
            delta = {"role": "assistant", "content": ev} if first else {"content": ev}
            first = False
            yield sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    finally:
        submission.cancel()  # no-op when finished; a client that left stops the model here
    metrics.observe(ev)
    if first:  # nothing was generated (immediate EOS): still announce the role
        yield sse(
            {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        )
    final: dict[str, Any] = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": ev.finish_reason}]}
    if not call.include_usage:
        final["usage"] = ev.usage()
    yield sse(final)
    if call.include_usage:
        yield sse({**base, "choices": [], "usage": ev.usage()})
    yield b"data: [DONE]\n\n"
