"""RoutingState: what the proxies routing one route's replicas share — the seam for scale-out.

A Router keeps, per replica, the load the policies read (requests in flight, uncached prompt
tokens queued ahead of the first token) and, in approximate mode, a prefix index it teaches
itself from its own decisions. With one proxy process both live in that process
(`state_local.LocalState`). With several processes in front of the same replicas —
`kvgate serve --workers N` on one host (`state_workers.WorkerState`), or several proxies on
several machines (a shared store) — each must see the others' load and learn from the
others' routing decisions, or they pile requests onto one replica and scatter prefixes.

The contract, for every implementation:

* `add_load` is this process's own change and is called on the event loop per request: it must
  not block on the network or take a lock another process can hold (publish asynchronously,
  write a slot only this process writes);
* `load` returns the totals over every process sharing the state, this one's included; it may
  lag the others by a little (routing is a guess anyway), never by this process's own changes;
* `recorded` tells the others that `replica` now holds the chain `hashes` (this process has
  already recorded it in its own index); the others apply it to their prefix index with the
  `apply` callback given to `follow`. Delivery may be lossy: a lost record costs a prefill, never
  a wrong answer.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

# (replica name, chained block hashes the replica now holds) → apply to this process's index
ApplyRecord = Callable[[str, list[int]], None]


class RoutingState(Protocol):
    """One route's replica load and routing decisions, shared by the proxies routing it."""

    # whether other processes route on this state too (a next turn may reach one of them)
    shared: bool

    def add_load(self, replica: str, in_flight: int, pending_tokens: int) -> None:
        """Add this process's change to `replica`'s counts (deltas, may be negative)."""
        ...

    def load(self, replica: str) -> tuple[int, int]:
        """(requests in flight, pending prefill tokens) on `replica`, summed over every process."""
        ...

    def recorded(self, replica: str, hashes: Sequence[int]) -> None:
        """This process routed a chain to `replica` (approximate mode): tell the others."""
        ...

    def follow(self, apply: ApplyRecord) -> None:
        """From now on, apply the other processes' records to this process's index."""
        ...

    def close(self) -> None: ...


# builds one route's state from (route name, its replica names)
StateFactory = Callable[[str, Sequence[str]], RoutingState]
