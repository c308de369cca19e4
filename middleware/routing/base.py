"""What every routing policy sees: replica states and the plan of one request."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from kvgate.index.kv.prompt import PromptHashes


@dataclass
class ReplicaState:
    """Live view of one backend replica, updated by the Router."""

    name: str
    api_base: str
    api_key: str | None = None
    in_flight: int = 0  # requests sent, not yet finished
    pending_prefill_tokens: int = 0  # uncached prompt tokens of requests not yet past their first token
    # what the replica's engine reports of itself (engine_load.py; filled in by the Router before
    # each decision): its measured prefill rate (None: not measured yet) and the prefill tokens
    # waiting in it, from its last report, aged by the time since
    prefill_rate: float | None = None
    engine_waiting_tokens: float = 0.0
    # prompt tokens of the conversations the replica's engine holds as far as the router knows (its
    # blocks in the prefix index, plus the uncached tokens on their way in); filled in by the Router
    # before each decision for a policy that places new conversations by it (cache_aware's
    # new_sessions: resident)
    resident_tokens: int = 0
    healthy: bool = True
    down_until: float = 0.0  # circuit open until then (monotonic clock)
    failures: int = 0  # in a row; 0 again after a success
    requests: int = 0  # attempts sent, ever
    marked_down: int = 0  # times its circuit opened, ever


@dataclass
class RoutePlan:
    """One request, ready for a policy: its prefix hashes and what each replica holds of them."""

    # the prompt's leading block hashes: all of them, or (a partial `prompt`, see Router.prepare)
    # up to a block no replica held, past which no match goes; `prompt.complete()` has them all
    hashes: list[int]
    # estimated while `prompt` still has a long message to tokenise (kvgate.index.kv.prompt_hashes)
    prompt_tokens: int
    block_size: int
    matched_blocks: dict[str, int] = field(default_factory=dict)  # replica → leading blocks held
    session: str | None = None  # user / session id for affinity
    # whether the longest match ends at a block that recorded chains continued in two different
    # ways (a document or system prompt several conversations share: PrefixIndex.forked), rather
    # than one conversation's own history; cache_aware bounds the queueing the two may buy apart
    shared_prefix: bool = True
    # the router's own: the prompt's chain states (prompt + answer resumes from them: Router.answer_hashes)
    prompt: PromptHashes | None = field(default=None, repr=False)
    salt: str | None = field(default=None, repr=False)  # the engine's cache_salt, part of these hashes
    # leading blocks each replica could load from a KV tier it reads (middleware/routing/tiers.py),
    # and what a loaded token costs in prefill tokens (middleware/routing/load_cost.py)
    tier_blocks: dict[str, int] = field(default_factory=dict)
    load_cost: float = 1.0

    def matched_tokens(self, replica: str) -> int:
        return min(self.matched_blocks.get(replica, 0) * self.block_size, self.prompt_tokens)

    def loadable_tokens(self, replica: str) -> int:
        """Prompt tokens beyond the engine's own match that `replica` could load from a tier
        (never the block holding the prompt's last token, which the engine computes)."""
        tier = self.tier_blocks.get(replica, 0)
        if not tier or self.prompt_tokens <= 0 or self.block_size <= 0:
            return 0
        end = min(tier, (self.prompt_tokens - 1) // self.block_size) * self.block_size
        return max(0, end - self.matched_tokens(replica))

    def held_tokens(self, replica: str) -> int:
        """Prompt tokens `replica` need not recompute: its engine's match plus what it can load."""
        return self.matched_tokens(replica) + self.loadable_tokens(replica)

    def expected_cached_tokens(self, replica: str) -> int:
        """What the engine should report as cached on `replica`: the matched whole blocks, but
        never the block holding the prompt's last token (an engine computes at least that one)."""
        if self.prompt_tokens <= 0 or self.block_size <= 0:
            return 0
        return min(self.matched_blocks.get(replica, 0), (self.prompt_tokens - 1) // self.block_size) * self.block_size


class RoutingPolicy(Protocol):
    """Chooses one replica among the candidates (healthy, not yet tried for this request)."""

    name: str

    def choose(self, candidates: Sequence[ReplicaState], plan: RoutePlan) -> ReplicaState: ...


class Rotation:
    """A thread-safe turn counter for breaking ties: each call hands the candidates back rotated one
    place further, so a policy that keeps the first of equals spreads them round robin."""

    def __init__(self) -> None:
        self._turns = itertools.count()
        self._lock = threading.Lock()

    def turn(self) -> int:
        with self._lock:
            return next(self._turns)

    def rotated(self, candidates: Sequence[ReplicaState]) -> list[ReplicaState]:
        turn, n = self.turn(), len(candidates)
        return [candidates[(turn + i) % n] for i in range(n)]
