"""The proxy's Server-Timing header (`server.timing_header`): where a request's time went before
its first bytes went out, in the W3C Server-Timing format that browsers' developer tools and HTTP
clients read.

Steps, in milliseconds, each from the end of the one before:
- `read`: the body read, parsed and checked (from the handler's start);
- a relayed miss: `plan` (the cache look-up, the prompt's prefix match and the replica's choice,
  failed attempts included), `engine` (the request written to the answering replica until its
  first bytes are read: a stream's first event, else the whole body), `relay` (until the
  response's head goes out);
- a hit: `cache`; a miss forwarded through LiteLLM: `forward`.

Invariant: the steps add up to the time from the handler's start to the head going out; what the
header cannot see is the server's own parsing before the handler and the network on either side.
"""

from __future__ import annotations

HEADER = "server-timing"


def _step(name: str, start: float, end: float) -> str:
    return f"{name};dur={max(0.0, end - start) * 1000:.2f}"


def server_timing(arrived: float, stamps: tuple[float, ...], now: float, hit: bool) -> str:
    """The header's value. `arrived`: the handler's start; `stamps`: CacheInfo.timing (the
    pipeline's start, and for a relayed miss the replica's send and first bytes); `now`: the head
    is about to go out. All perf_counter seconds."""
    if not stamps:  # the pipeline never started (an answer built before it)
        return _step("read", arrived, now)
    started = stamps[0]
    steps = [_step("read", arrived, started)]
    if len(stamps) == 3:
        sent, first = stamps[1], stamps[2]
        steps += [_step("plan", started, sent), _step("engine", sent, first), _step("relay", first, now)]
    else:
        steps.append(_step("cache" if hit else "forward", started, now))
    return ", ".join(steps)
