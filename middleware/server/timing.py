"""The proxy's Server-Timing header (`server.timing_header`): where a request's time went before
its first bytes went out, in the W3C Server-Timing format that browsers' developer tools and HTTP
clients read.

Steps, in milliseconds, each from the end of the one before:
- `read`: the body read, parsed and checked (from the handler's start);
- a relayed miss, from the pipeline's start until the request is written to the replica, in four
  parts:
  - `hop`: before and after the look-up step: the route matched, and where the look-up runs on a
    worker thread (a long prompt, a store on the network: kvgate.middleware.cache.offload) the
    hand-offs to it and back to the event loop, waits for a core and the GIL included;
  - `cache`: the request's keys, the exact and semantic tiers looked up;
  - `prefix`: the prompt hashed and matched against the replicas' caches, where the look-up step
    does it (a worker thread's); 0 when the look-up ran on the loop, which leaves it to `route`;
  - `route`: the replica's choice (and the prefix match where `prefix` did not do it), failed
    attempts, the connection, the request written;
- then `engine` (the request written to the answering replica until its first bytes are read: a
  stream's first event, else the whole body) and `relay` (until the response's head goes out);
- a hit: `cache`; a miss forwarded through LiteLLM: `forward`.

Invariant: the steps add up to the time from the handler's start to the head going out; what the
header cannot see is the server's own parsing before the handler and the network on either side.
"""

from __future__ import annotations

HEADER = "server-timing"


def _dur(name: str, seconds: float) -> str:
    return f"{name};dur={seconds * 1000:.2f}"


def _step(name: str, start: float, end: float) -> str:
    return _dur(name, max(0.0, end - start))


def server_timing(arrived: float, stamps: tuple[float, ...], now: float, hit: bool) -> str:
    """The header's value. `arrived`: the handler's start; `stamps`: CacheInfo.timing (the
    pipeline's start; for a relayed miss then the look-up step's start, its tiers' and its prefix
    match's ends, the loop's resumption after it, the replica's send and first bytes); `now`: the head is about to
    go out. All perf_counter seconds."""
    if not stamps:  # the pipeline never started (an answer built before it)
        return _step("read", arrived, now)
    started = stamps[0]
    steps = [_step("read", arrived, started)]
    if len(stamps) == 7:
        begun, tiers, matched, back, sent, first = stamps[1:]
        hop = max(0.0, begun - started) + max(0.0, back - matched)
        steps += [
            _dur("hop", hop),
            _step("cache", begun, tiers),
            _step("prefix", tiers, matched),
            _step("route", back, sent),
            _step("engine", sent, first),
            _step("relay", first, now),
        ]
    else:
        steps.append(_step("cache" if hit else "forward", started, now))
    return ", ".join(steps)
