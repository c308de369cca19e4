"""The load generators' streaming client: one POST, its answer read as raw bytes, the time to the
first content. Every router (and the direct backend) is measured with it, so what the client
itself costs is the same for all; it is the relay's own HTTP/1.1 client (kvgate.middleware.forward.http1,
httptools), which costs the generator less CPU per request than aiohttp's or httpx's clients.
A Python load generator's own event-loop lag delays every TTFT it measures, the more so the faster
a trace is replayed: the arena samples it with kvgate.middleware.telemetry.loop_lag's watcher and reports it.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

from kvgate.middleware.forward.http1 import Pool


class StreamScan:
    """What the load generator reads from a streamed answer, found in the raw bytes as they come
    (no line splitting or decoding per event).

    Invariant: `feed` returns True from the first call whose bytes complete a `"content"` key of
    an event, whatever the chunking; `error` is set once an event starts with `{"error"`."""

    CONTENT = b'"content"'
    ERROR = b'data: {"error"'

    def __init__(self) -> None:
        self.error: str | None = None
        self._content = False
        self._tail = b""

    def feed(self, data: bytes) -> bool:
        window = self._tail + data
        if not self._content and self.CONTENT in window:
            self._content = True
        if self.error is None and (at := window.find(self.ERROR)) >= 0:
            self.error = window[at : at + 200].decode(errors="replace")
        self._tail = window[-(len(self.ERROR) - 1) :]
        return self._content


@dataclass
class Timed:
    """One streamed request as the client saw it: seconds to the first content and to the end
    (None when it did not get there), and the error when it failed."""

    ttft: float | None = None
    total: float | None = None
    error: str | None = None
    head: bytes = b""  # with keep=True: the answer's first and last KEEP bytes (which replica, its usage)
    tail: bytes = b""


KEEP = 512


def answered(t: Timed) -> tuple[str | None, int | None]:
    """(replica, cached prompt tokens) of a sim replica's streamed answer kept with keep=True: the
    answer starts with "[name]" (engines/sim/server.py's answer_words) and its usage ends it."""
    name = re.search(rb'"content":\s*"\[([^\]"]+)\]', t.head)
    cached = re.findall(rb'"cached_tokens":\s*(\d+)', t.tail)
    return (name.group(1).decode() if name else None, int(cached[-1]) if cached else None)


async def timed_stream(
    client: Pool, url: str, body: bytes, headers: dict[str, str], timeout: float, keep: bool = False
) -> Timed:
    """POST `body` (JSON, streamed answer) and read it to its end; never raises for the server's
    failures (status, in-band error event, connection, timeout), which come back in `error`.
    `keep` also keeps the answer's first and last KEEP bytes (`answered` reads them)."""
    out, scan = Timed(), StreamScan()
    sent = time.perf_counter()
    try:
        resp = await client.post(url, body, {**headers, "content-type": "application/json"}, timeout)
        try:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.read())[:200]!r}"
                return out
            async for data in resp.chunks():
                seen = scan.feed(data)
                if keep:
                    if len(out.head) < KEEP:
                        out.head += data[: KEEP - len(out.head)]
                    out.tail = (out.tail + data)[-KEEP:]
                if scan.error is not None:
                    out.error = scan.error
                    return out
                if out.ttft is None and seen:
                    out.ttft = time.perf_counter() - sent
        finally:
            resp.close()
    except (ConnectionError, asyncio.TimeoutError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    out.total = time.perf_counter() - sent
    if out.ttft is None:
        out.error = "stream ended without content"
    return out
