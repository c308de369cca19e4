"""The pipeline's steps that run on frames other than the request's own: the look-up hop (a
worker thread, or inline), the record step (a worker thread, or the loop's group commit) and a
streamed miss's end (as the client reads the stream).

kvgate.middleware.pipeline decides where each runs and in which order; these are their bodies,
each a few calls into the response cache and the route's forwarder, which never call each other or
back into the pipeline. They live beside pipeline.py rather than in it so that the pipeline module
is entered once per request (`acomplete`), whatever runs on a thread or on the client's reads.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, AsyncIterator

from kvgate.middleware.cache.group_commit import Settle
from kvgate.middleware.cache.response_cache import Looked, ResponseCache
from kvgate.middleware.config import RouteConfig
from kvgate.middleware.forward.forwarded import Forwarded
from kvgate.middleware.forward.forwarder import Forwarder
from kvgate.middleware.outcome import CacheInfo
from kvgate.middleware.request import CacheControl
from kvgate.middleware.text_answers import DONE, Last


def look_up(
    cache: ResponseCache,
    forwarder: Forwarder,
    route: RouteConfig,
    kwargs: dict[str, Any],
    tenant: str,
    control: CacheControl | None,
    endpoint: str,
    started: float,
    inline: bool,
    raw: bool = False,
) -> Looked:
    """The request view, the cache's tiers (a hit is served from here; `raw`: as bytes, for the
    proxy) and, on a miss, the forwarder's prepare: the prompt hashed and matched for the
    router's plan. Inline, the plan hashes the small prompt itself, on the loop, where `prepare`
    would only add a copy. Stamps its parts' ends in `Looked.spans`."""
    begun = time.perf_counter()
    view = cache.view(route, kwargs, tenant, control, endpoint)
    looked = cache.look_up(view, started, inline, raw)
    tiers = time.perf_counter()
    if looked.result is None and not inline:
        forwarder.prepare(view)
    looked.spans = (begun, tiers, time.perf_counter())
    return looked


def record(
    cache: ResponseCache,
    forwarder: Forwarder,
    looked: Looked,
    info: CacheInfo,
    forwarded: Forwarded,
    answer: str | None,
) -> Settle:
    """A complete answer's record step: prompt + answer's routing hashes (handed to the router
    once the forwarder is done), then the cache's write, request-log record and metrics."""
    forwarder.hash_answer(forwarded, answer)
    return cache.record(looked, info, answer, forwarded.payload, forwarder.model_for(looked.view))


async def recorded(
    cache: ResponseCache, forwarder: Forwarder, looked: Looked, info: CacheInfo, forwarded: Forwarded
) -> None:
    """The record step where it belongs (on the loop when the request and its answer are small),
    then the forwarder told it is done: also when the step fails or the client leaves meanwhile,
    since the replica's books must balance."""
    answer = forwarded.text
    # a route that caches nothing writes nothing in its record step: no batch to join
    inline, writes = cache.records_inline(looked, answer), looked.view.route.caches
    try:
        await cache.step(inline, record, cache, forwarder, looked, info, forwarded, answer, writes=writes)
    finally:
        forwarder.done(forwarded, True)


async def ending(
    cache: ResponseCache, forwarder: Forwarder, looked: Looked, info: CacheInfo, forwarded: Forwarded
) -> AsyncIterator[Any]:
    """A streamed miss as the client reads it: the replica's stream, then, once it ended whole,
    the record step (so the answer is stored before the stream's end reaches the client) and
    [DONE] after a relayed stream. A stream that broke or that the client left is never stored.
    Closing this closes the replica's stream.

    A relayed stream's last bytes, when they came with the replica's own [DONE] after the client
    has had its first ones, wait for the record step and go out with our [DONE] as one `Last`:
    the same bytes in one write fewer. The first bytes are never held (a stream that came whole
    in one read still goes out at once), so the time to the first token does not move."""
    cache.first_token(looked)  # its first events are in: the client's first bytes go out now
    tail, sent = b"", False
    try:
        async with contextlib.aclosing(forwarded.reply) as stream:
            async for item in stream:
                if tail:  # more after the replica's [DONE] (an error event): in order
                    yield tail
                    tail = b""
                if sent and forwarded.raw and forwarded.ended:
                    tail = item
                    continue
                sent = True
                yield item
    finally:
        if not forwarded.ok:
            forwarder.done(forwarded, False)
    if forwarded.ok:
        await recorded(cache, forwarder, looked, info, forwarded)
    if forwarded.raw:
        yield Last(tail + DONE)
