"""The Router of one route: prompt → block hashes → prefix matches → policy → replica.

It also keeps the replica states the policies read (in-flight counts, queued prefill tokens,
health) and, in approximate mode, teaches the PrefixIndex what each replica now caches.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import httpx

from index.kv_events import EventApplier, FeedStats, ZmqEventSubscriber
from index.prefix import PrefixIndex
from index.prompt import PromptHasher
from index.tokenizer import load_tokenizer
from middleware.config import ReplicaConfig, RoutingConfig
from middleware.routing.base import ReplicaState, RoutePlan, RoutingPolicy
from middleware.routing.factory import make_policy

log = logging.getLogger("kvgate.router")


@dataclass
class Ticket:
    """One attempt of one request on one replica, from send to finish."""

    replica: ReplicaState
    plan: RoutePlan
    pending: int  # uncached tokens this attempt added to the replica's queue
    first_token_seen: bool = False


def policy_options(cfg: RoutingConfig) -> dict[str, Any]:
    if cfg.policy == "cache_aware":
        return {"decode_weight": cfg.decode_weight, "miss_weight": cfg.miss_weight}
    if cfg.policy == "affinity":
        return {"load_factor": cfg.load_factor}
    return {}


class Router:
    def __init__(
        self,
        replicas: Sequence[ReplicaConfig],
        cfg: RoutingConfig,
        *,
        hasher: PromptHasher | None = None,
        index: PrefixIndex | None = None,
        policy: RoutingPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not replicas:
            raise ValueError("a router needs at least one replica")
        self.cfg = cfg
        self.replicas = [ReplicaState(r.name, r.api_base, r.api_key) for r in replicas]
        self.hasher = hasher or PromptHasher(load_tokenizer(cfg.tokenizer), cfg.block_size, seed=cfg.seed)
        self.index = index or PrefixIndex(cfg.capacity_blocks, touch_on_match=cfg.mode == "precise")
        for r in replicas:
            if r.name not in self.index.replicas:
                self.index.add_replica(r.name, r.capacity_blocks or cfg.capacity_blocks)
        self.policy = policy or make_policy(cfg.policy, **policy_options(cfg))
        self._clock = clock
        self._lock = threading.Lock()
        self._subscribers: list[ZmqEventSubscriber] = []
        if cfg.mode == "precise":
            for r in replicas:
                if r.events:  # config validation guarantees every replica has one in precise mode
                    applier = EventApplier(self.index, r.name, cfg.block_size, seed=cfg.seed)
                    self._subscribers.append(ZmqEventSubscriber(r.events, applier).start())

    def close(self) -> None:
        for sub in self._subscribers:
            sub.stop()

    # ------------------------------------------------------------------ decisions
    def plan(self, messages: Sequence[dict[str, Any]], session: str | None = None) -> RoutePlan:
        hashes, tokens = self.hasher.hashes(messages)
        if session is None and messages:
            first = messages[0].get("content")
            session = first if isinstance(first, str) else None
        return RoutePlan(hashes, tokens, self.cfg.block_size, self.index.match(hashes), session)

    def candidates(self, exclude: set[str] = frozenset()) -> list[ReplicaState]:
        """Healthy replicas, plus down ones whose cool-down passed (half-open). If every replica
        is down, all untried ones: trying a maybe-dead replica beats failing for certain."""
        now = self._clock()
        untried = [r for r in self.replicas if r.name not in exclude]
        up = [r for r in untried if r.healthy or now >= r.down_until]
        return up or untried

    def choose(self, plan: RoutePlan, exclude: set[str] = frozenset()) -> ReplicaState | None:
        candidates = self.candidates(exclude)
        if not candidates:
            return None
        with self._lock:
            return self.policy.choose(candidates, plan)

    # ------------------------------------------------------------------ bookkeeping
    def started(self, replica: ReplicaState, plan: RoutePlan) -> Ticket:
        pending = max(0, plan.prompt_tokens - plan.matched_tokens(replica.name))
        with self._lock:
            replica.in_flight += 1
            replica.requests += 1
            replica.pending_prefill_tokens += pending
        if self.cfg.mode == "approximate":
            self.index.record(replica.name, plan.hashes)
        return Ticket(replica, plan, pending)

    def first_token(self, ticket: Ticket) -> None:
        with self._lock:
            if not ticket.first_token_seen:
                ticket.first_token_seen = True
                ticket.replica.pending_prefill_tokens -= ticket.pending

    def finished(self, ticket: Ticket, ok: bool, conversation: Sequence[dict[str, Any]] | None = None) -> None:
        """The attempt ended. On success the replica is healthy; in approximate mode the blocks of
        prompt + answer (`conversation`) are now in its cache, ready for the next turn."""
        self.first_token(ticket)
        with self._lock:
            ticket.replica.in_flight -= 1
            if ok:
                ticket.replica.healthy, ticket.replica.failures = True, 0
        if ok and conversation is not None and self.cfg.mode == "approximate" and self.cfg.record_answers:
            hashes, _ = self.hasher.hashes(conversation)
            self.index.record(ticket.replica.name, hashes)

    def mark_down(self, replica: ReplicaState, reason: str) -> None:
        with self._lock:
            replica.healthy = False
            replica.failures += 1
            replica.marked_down += 1
            replica.down_until = self._clock() + self.cfg.down_for_s
        log.warning("replica %s marked down for %.1fs: %s", replica.name, self.cfg.down_for_s, reason)

    def mark_up(self, replica: ReplicaState) -> None:
        with self._lock:
            was_down = not replica.healthy
            replica.healthy, replica.failures = True, 0
        if was_down:
            log.info("replica %s is back", replica.name)

    async def probe(self, client: httpx.AsyncClient) -> None:
        """One health round: GET {api_base}/models on every down replica; 200 re-admits it."""
        for replica in [r for r in self.replicas if not r.healthy]:
            try:
                resp = await client.get(f"{replica.api_base.rstrip('/')}/models", timeout=2.0)
                if resp.status_code == 200:
                    self.mark_up(replica)
            except httpx.HTTPError:
                pass

    def event_stats(self) -> dict[str, FeedStats]:
        """Per replica, its KV-event feed's counters (precise mode; empty otherwise)."""
        return {sub.applier.replica: sub.feed.stats() for sub in self._subscribers}

    def stats(self) -> dict[str, Any]:
        return {
            r.name: {"healthy": r.healthy, "in_flight": r.in_flight, "requests": r.requests,
                     "pending_prefill_tokens": r.pending_prefill_tokens, "blocks": self.index.blocks(r.name)}
            for r in self.replicas
        }
