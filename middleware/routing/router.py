"""The Router of one route: prompt → block hashes → prefix matches → policy → replica.

It composes the parts that each do one job: the planner (planner.py: hashes and matches, ahead
of time on a worker thread), the policy (one file per policy, pure scoring over the candidates),
the prefix index (index/kv/prefix.py), approximate mode's records (records.py) or precise mode's
KV-event feed (precise.py), replica health (health.py), each replica's engine (engines.py) and the
load shared with other proxy processes (a RoutingState: state.py; alone, a LocalState). The
router itself keeps the replica list and the load bookkeeping of each attempt (a Ticket).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import httpx

from kvgate.index.kv.hash_loops import native as native_hashing
from kvgate.index.kv.kv_events import FeedStats
from kvgate.index.kv.prefix import EVENT_FED_CAPACITY, PrefixIndex
from kvgate.index.kv.prompt import Prompt, PromptHasher
from kvgate.index.kv.tokenizer import load_tokenizer
from kvgate.middleware.config import ReplicaConfig, RoutingConfig
from kvgate.middleware.engines.base import EngineInfo
from kvgate.middleware.routing.base import ReplicaState, RoutePlan, RoutingPolicy
from kvgate.middleware.routing.engine_load import EngineLoad, EngineReport
from kvgate.middleware.routing.engines import EngineBook
from kvgate.middleware.routing.factory import make_policy
from kvgate.middleware.routing.health import ReplicaHealth
from kvgate.middleware.routing.inflight import InFlightPrefixes, Routed
from kvgate.middleware.routing.load_cost import LoadCost
from kvgate.middleware.routing.mirror import EngineMirror
from kvgate.middleware.routing.pending_answers import AnswerNote, PendingAnswers
from kvgate.middleware.routing.planner import Planner
from kvgate.middleware.routing.precise import PreciseRouting, Watch
from kvgate.middleware.routing.records import Records
from kvgate.middleware.routing.router_stats import replica_stats
from kvgate.middleware.routing.salt import Salter
from kvgate.middleware.routing.state import RoutingState
from kvgate.middleware.routing.state_local import LocalState
from kvgate.middleware.routing_config import APPROXIMATE_BLOCK_TOKENS

# kvgate.index.kv's C extensions (_prefix_loops, _hash_loops) where they were not built
REBUILD = "Install again where a C compiler and Python's and OpenSSL's headers are (docs/routing.md)"
log = logging.getLogger("kvgate.router")


@dataclass
class Ticket:
    """One attempt of one request on one replica, from send to finish."""

    replica: ReplicaState
    plan: RoutePlan
    pending: int  # uncached tokens this attempt added to the replica's queue
    first_token_seen: bool = False
    sent_at: float = 0.0  # the router's clock when it was sent
    queued: int = 0  # prefill tokens queued ahead of it on the replica then
    loaded: int = 0  # tokens the plan expected the replica to load from a KV tier
    watch: Watch | None = None  # precise mode: what the request is judged by once it finished (PreciseRouting.sent)
    routed: Routed | None = None  # precise mode: its blocks on their way to the replica (InFlightPrefixes.sent)


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
        state: RoutingState | None = None,
        defer_records: bool = False,
        salter: Salter | None = None,
        name: str = "route",
    ) -> None:
        if not replicas:
            raise ValueError("a router needs at least one replica")
        self.cfg = cfg
        self.name = name
        self.replicas = [ReplicaState(r.name, r.api_base, r.api_key) for r in replicas]
        # precise mode hashes only once the engines said how (block size, tokenizer): None until then
        prefix = cfg.prefix
        if hasher is None and prefix.mode == "approximate":
            hasher = PromptHasher(
                load_tokenizer(prefix.tokenizer), prefix.block_size or APPROXIMATE_BLOCK_TOKENS, seed=prefix.seed
            )
        bound = prefix.capacity_blocks or EVENT_FED_CAPACITY  # approximate: the engine's, once it says (mirror.py)
        self.index = index or PrefixIndex(bound, touch_on_match=prefix.mode == "precise")
        built = {"_prefix_loops": self.index.native_loops, "_hash_loops": native_hashing()}
        if slow := [m for m, native in built.items() if not native]:  # same routing, more CPU per request
            log.warning("route %s: C loops %s not built here: they run in Python. " + REBUILD, name, slow)
        for r in replicas:
            if r.name not in self.index.replicas:
                self.index.add_replica(r.name, r.capacity_blocks or prefix.capacity_blocks)
        self.policy = policy or make_policy(cfg.policy)
        self._reads_engine_load = bool(getattr(self.policy, "reads_engine_load", False))
        self._reads_resident = bool(getattr(self.policy, "reads_resident", False))
        self._clock = clock
        self._lock = threading.Lock()  # replica list and load bookkeeping
        self._names = frozenset(r.name for r in self.replicas)
        self.state: RoutingState = state or LocalState([r.name for r in replicas])
        self.health = ReplicaHealth(cfg.down_for_s, clock)
        self.records = Records(self.index, self.state, deferred=defer_records and prefix.mode == "approximate")
        records_answers = prefix.mode == "approximate" and prefix.record_answers
        # alone, an answer is hashed by its next turn (pending_answers.py); shared, as it finishes
        pending = None if self.state.shared else PendingAnswers()  # Planner keeps it only with records_answers
        self.planner = Planner(hasher, self.index, self.records, prefix.block_size or 1, records_answers, pending)
        self.mirror: EngineMirror | None = None
        if prefix.mode == "approximate":
            self.state.follow(self._apply_peer)
            fixed = {r.name for r in replicas if r.capacity_blocks}
            self.mirror = EngineMirror(name, prefix, self.index, hasher, fixed, self._use_hasher)
        # what each replica's engine said of itself (kvgate.middleware.engines), once it answered
        self.book = EngineBook(name, cfg.engine, cfg.cache_salt, salter, self._engine_found)
        self.precise: PreciseRouting | None = None
        self.inflight: InFlightPrefixes | None = None
        self.load_cost = LoadCost()  # what a token loaded from a KV tier costs, in prefill tokens
        # each replica's engine on its own load and speed, from the proxy's poller (engine_load.py)
        self.engine_load = EngineLoad(clock)
        if prefix.mode == "precise":
            self.precise = PreciseRouting(name, prefix, self.index, list(replicas), self._use_hasher, clock)
            self.planner.tiers = self.precise.tiers
            # prefixes routed and not yet reported by the engine count as held by their replica
            self.planner.inflight = self.inflight = InFlightPrefixes(self.index, clock, deferred=defer_records)

    def _use_hasher(self, hasher: PromptHasher) -> None:
        """The engines' block size (and in precise mode tokenizer) are known (again): hash with them."""
        self.planner.hasher = hasher

    @property
    def hasher(self) -> PromptHasher | None:
        return self.planner.hasher

    @property
    def block_size(self) -> int:
        return self.planner.block_size

    def close(self) -> None:
        self.records.close()
        for part in (self.inflight, self.precise):
            if part is not None:
                part.close()
        self.state.close()

    # ------------------------------------------------------------------ engines
    @property
    def engines(self) -> dict[str, EngineInfo]:
        return self.book.engines

    @property
    def discovered(self) -> bool:
        return not self.book.missing([r.name for r in self.replicas])

    async def discover(self, client: httpx.AsyncClient | None = None, *, not_within: float = 0.0) -> None:
        """Ask every replica not yet described what engine it runs (EngineBook.discover)."""
        await self.book.discover([(r.name, r.api_base) for r in self.replicas], client, not_within=not_within)

    def know_engines_soon(self, not_within: float, new_client: Callable[[], Any] | None = None) -> bool:
        """EngineBook.discover_later over this route's replicas."""
        return self.book.discover_later([(r.name, r.api_base) for r in self.replicas], not_within, new_client)

    def readiness(self) -> str | None:
        """None when requests are routed as configured; else what the route still waits for
        (precise mode: the tokenizer and block size of an engine that described itself; one
        replica down does not hold the others back). A route that is not ready still answers:
        it routes by load until then."""
        return self.precise.readiness() if self.precise is not None else None

    @property
    def model_revision(self) -> str | None:
        """The model revision the replicas serve now (EngineBook.revision); None: none told."""
        return self.book.revision

    async def recheck_engines(self, client: httpx.AsyncClient) -> None:
        """Ask the replicas for their model revision again (EngineBook.recheck)."""
        await self.book.recheck([(r.name, r.api_base) for r in self.replicas], client)

    def _engine_found(self, name: str, info: EngineInfo) -> None:
        if self.precise is not None and name in self._names:
            self.precise.engine_found(name, info)
        elif self.mirror is not None and name in self._names:
            self.mirror.engine_found(name, info)

    @property
    def context_limit(self) -> int | None:
        """The smallest context length the route's engines reported (None until one did)."""
        limits = [e.max_model_len for e in self.engines.values() if e.max_model_len]
        return min(limits) if limits else None

    def salt(self, tenant: str | None, client_salt: object = None) -> str | None:
        """The cache_salt of a request of `tenant` (EngineBook.salt); part of its hashes too."""
        return self.book.salt(tenant, client_salt)

    def _apply_peer(self, replica: str, hashes: list[int]) -> None:
        """Another proxy process routed this chain to `replica` (approximate mode)."""
        if replica in self._names:
            self.index.record(replica, hashes)

    def refresh_load(self, replicas: Sequence[ReplicaState] | None = None) -> None:
        """Copy the shared load (every process's) into the replica states the policies read, and
        what the engines last reported where the policy reads it."""
        engines, now = self.reads_engine_load, self._clock()
        for r in self.replicas if replicas is None else replicas:
            r.in_flight, r.pending_prefill_tokens = self.state.load(r.name)
            if engines:
                r.prefill_rate, r.engine_waiting_tokens = self.engine_load.view(r.name, now)
            if self._reads_resident:
                r.resident_tokens = self.index.blocks(r.name) * self.block_size + r.pending_prefill_tokens

    @property
    def reads_engine_load(self) -> bool:
        """Whether this route's policy times requests from the engines' reports (prefill_time)."""
        return self._reads_engine_load

    def engine_report(self, name: str, report: EngineReport, at: float | None = None) -> None:
        """A reading of replica `name`'s engine (the proxy's poller; any thread)."""
        if name in self._names:
            self.engine_load.report(name, report, at)

    # ------------------------------------------------------------------ decisions
    def prepare(self, messages: Prompt, salt: str | None = None) -> None:
        """Hash and match a prompt ahead of its `plan` (Planner.prepare; for a worker thread)."""
        self.planner.prepare(messages, salt, self.context_limit if self.precise is not None else None)

    def settle(self, timeout: float | None = None) -> bool:
        """Wait for the records submitted so far (Records.settle)."""
        return self.records.settle(timeout)

    def plan(self, messages: Prompt, session: str | None = None, salt: str | None = None) -> RoutePlan:
        plan = self.planner.plan(messages, session, salt)
        plan.load_cost = self.load_cost.value
        return plan

    def answer_hashes(self, plan: RoutePlan, conversation: Prompt) -> list[int] | None:
        """prompt + answer's hashes for `finished` (Planner.answer_hashes; thread-safe)."""
        return self.planner.answer_hashes(plan, conversation)

    def candidates(self, exclude: set[str] = frozenset()) -> list[ReplicaState]:
        return self.health.candidates(self.replicas, exclude)

    def choose(self, plan: RoutePlan, exclude: set[str] = frozenset()) -> ReplicaState | None:
        candidates = self.candidates(exclude)
        if not candidates:
            return None
        with self._lock:
            self.refresh_load(candidates)
            return self.policy.choose(candidates, plan)

    # ------------------------------------------------------------------ bookkeeping
    def started(self, replica: ReplicaState, plan: RoutePlan) -> Ticket:
        loaded = plan.loadable_tokens(replica.name)
        pending = max(0, plan.prompt_tokens - plan.matched_tokens(replica.name) - loaded)
        with self._lock:
            queued = replica.pending_prefill_tokens
            self.state.add_load(replica.name, 1, pending)
            replica.in_flight += 1
            replica.requests += 1
            replica.pending_prefill_tokens += pending
        watch = None
        if self.cfg.prefix.mode == "approximate":
            # with answers recorded at the finish, it touches the whole chain again: here only what is new there
            held = plan.matched_blocks.get(replica.name, 0) if self.planner.answers_at_finish else 0
            chain = plan.prompt if plan.prompt is not None and plan.prompt.partial else plan.hashes
            self.records.record(replica.name, chain, held)
        elif self.precise is not None:
            watch = self.precise.sent(replica.name, plan.hashes)
        ticket = Ticket(replica, plan, pending, sent_at=self._clock(), queued=queued, loaded=loaded, watch=watch)
        ticket.routed = self.inflight.sent(replica.name, plan.hashes, plan.prompt) if self.inflight else None
        return ticket

    def first_token(self, ticket: Ticket, measured: bool = True) -> None:
        """The attempt's first token arrived (`measured`: now, so its time is a TTFT sample)."""
        with self._lock:
            if ticket.first_token_seen:
                return
            ticket.first_token_seen = True
            self.state.add_load(ticket.replica.name, 0, -ticket.pending)
            ticket.replica.pending_prefill_tokens -= ticket.pending
        if measured and self.precise is not None and ticket.plan.hashes:
            self.load_cost.observe(ticket.queued + ticket.pending, ticket.loaded, self._clock() - ticket.sent_at)

    def finished(self, ticket: Ticket, ok: bool, hashes: list[int] | AnswerNote | None = None) -> None:
        """The attempt ended. On success the replica is healthy; in approximate mode the blocks of
        prompt + answer (`hashes`, or a note of them, from `answer_hashes`) are now in its cache,
        ready for the next turn."""
        self.first_token(ticket, measured=False)
        with self._lock:
            self.state.add_load(ticket.replica.name, -1, 0)
            ticket.replica.in_flight -= 1
        if ok:
            self.health.mark_up(ticket.replica)
        if self.precise is not None:
            self.precise.finished(ticket.watch, ok)
        if self.inflight is not None:
            self.inflight.done(ticket.routed)
        if ok and hashes and self.planner.records_answers:
            self.planner.answered(ticket.replica.name, hashes)

    def mark_down(self, replica: ReplicaState, reason: str) -> None:
        self.health.mark_down(replica, reason)

    async def probe(self, client: httpx.AsyncClient) -> None:
        """One health round (ReplicaHealth.probe). A replica refusing connections has no engine
        behind it, so (precise mode) no cache: its view is dropped, and its engine is asked again
        what it is once it answers (a restart may bring another version or block size)."""
        await self.health.probe(client, self.replicas, self.engine_gone)
        if self.precise is not None:
            self.precise.check()

    def engine_gone(self, name: str) -> None:
        """The replica's engine process is gone: forget its cache and what it said of itself."""
        self.book.forget(name)
        self.engine_load.forget(name)
        if self.inflight is not None:
            self.inflight.forget(name)
        if self.precise is not None and self.index.blocks(name):
            log.warning(
                "route %s: replica %s refuses connections; its %d blocks leave the prefix index",
                self.name,
                name,
                self.index.blocks(name),
            )
            self.precise.drop(name)

    def event_stats(self) -> dict[str, FeedStats]:
        """Per replica, its KV-event feed's counters (precise mode; empty otherwise)."""
        if self.precise is None:
            return {}
        return {name: sub.feed.stats() for name, sub in list(self.precise.subscribers.items())}

    def stats(self) -> dict[str, Any]:
        """Per replica: health, load, what the index holds of it, its engine (router_stats.py)."""
        with self._lock:
            self.refresh_load()
        return replica_stats(self.replicas, self.index, self.book, self.engine_load, self.precise, self.load_cost)

    # ------------------------------------------------------------------ replicas at run time
    # (the admin API, middleware/server/admin.py). Lists are replaced, never changed in place, so a
    # reader iterating a snapshot (candidates, probe, the metrics collector) stays safe.
    def add_replica(self, cfg: ReplicaConfig) -> ReplicaState:
        """Route to one more replica from now on. ValueError: the name is on this route already,
        precise mode without `events`, or a routing state that cannot count a new name (WorkerState:
        its shared load table is laid out at start-up)."""
        if self.cfg.prefix.mode == "precise" and not cfg.events:
            raise ValueError(f"routing.prefix.mode precise needs replicas[].events (a ZMQ endpoint) for: {[cfg.name]}")
        with self._lock:
            if cfg.name in self._names:
                raise ValueError(f"replica {cfg.name!r} is on this route already")
            learn = getattr(self.state, "add_replica", None)  # LocalState; RedisState counts any name
            if learn is not None:
                learn(cfg.name)
            try:
                self.state.load(cfg.name)
            except KeyError:
                raise ValueError(f"{type(self.state).__name__} cannot count a replica added at run time") from None
            if cfg.name not in self.index.replicas:
                self.index.add_replica(cfg.name, cfg.capacity_blocks or self.cfg.prefix.capacity_blocks)
            if self.mirror is not None:
                self.mirror.added(cfg.name, cfg.capacity_blocks)
            self._names = self._names | {cfg.name}  # claimed: a second add of the name fails from here on
        if self.precise is not None:
            try:  # outside the lock: start() waits for the socket, and routing must not
                self.precise.subscribe(cfg)
            except Exception:
                with self._lock:
                    self._names = self._names - {cfg.name}
                self.index.remove_replica(cfg.name)
                raise
        replica = ReplicaState(cfg.name, cfg.api_base, cfg.api_key)
        with self._lock:
            self.replicas = [*self.replicas, replica]
        return replica

    def remove_replica(self, name: str) -> None:
        """Route nothing more to `name`: its KV-event subscriber stops and the index forgets its
        blocks. Requests in flight on it finish normally (their late index records for it are
        dropped). KeyError: not on this route; ValueError: the route's last replica."""
        with self._lock:
            if not any(r.name == name for r in self.replicas):
                raise KeyError(name)
            if len(self.replicas) == 1:
                raise ValueError(f"replica {name!r} is the route's last one")
            self.replicas = [r for r in self.replicas if r.name != name]
            self._names = self._names - {name}
        if self.precise is not None:
            self.precise.unsubscribe(name)
        self.book.forget(name)
        self.book.revisions.pop(name, None)
        self.engine_load.forget(name)
        if self.inflight is not None:
            self.inflight.forget(name)
        if self.mirror is not None:
            self.mirror.forget(name)
        self.planner.forget(name)
        self.index.remove_replica(name)
