"""The Router of one route: prompt → block hashes → prefix matches → policy → replica.

It also keeps the replica states the policies read (in-flight counts, queued prefill tokens,
health) and, in approximate mode, teaches the PrefixIndex what each replica now caches. Load and
routing decisions go through a RoutingState (middleware/routing/state.py), so that several proxy
processes in front of the same replicas see each other's load and learn from each other's
decisions; alone, a LocalState keeps them in this process.

Work that grows with the prompt (rendering, tokenising, hashing, matching) can be done ahead, in
a worker thread, so the event loop only chooses: `prepare(messages)` before `plan` of the same
messages list, `prepare_answer(plan, ...)` before `finished`. Both are optional; without them
`plan` and `finished` compute the same hashes themselves.

With `defer_records=True` (the proxy's routers) the approximate-mode records of `started` and
`finished` run in order on one background thread instead of the caller's (the event loop).
`prepare` waits up to SETTLE_WAIT_S for the records submitted before it (`settle`), so a next
turn normally finds its previous answer's blocks; bounded, because under overload an unbounded
wait queues every request behind the recorder. Past MAX_PENDING_RECORDS queued records the
caller applies its own inline; a short chain with nothing queued is applied at once.

Long module: decisions, load bookkeeping and replica membership share one lock and one list of
replicas; what does not need them lives beside it (engines.py, precise.py, salt.py).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import httpx

from index.kv_events import FeedStats
from index.prefix import PrefixIndex
from index.prompt import PromptHasher, PromptHashes
from index.tokenizer import load_tokenizer
from middleware.config import ReplicaConfig, RoutingConfig
from middleware.engines.base import EngineInfo
from middleware.routing.base import ReplicaState, RoutePlan, RoutingPolicy
from middleware.routing.factory import make_policy
from middleware.routing.engines import EngineBook
from middleware.routing.precise import PreciseRouting
from middleware.routing.salt import Salter
from middleware.routing.state import RoutingState
from middleware.routing.state_local import LocalState

log = logging.getLogger("kvgate.router")


@dataclass
class Ticket:
    """One attempt of one request on one replica, from send to finish."""

    replica: ReplicaState
    plan: RoutePlan
    pending: int  # uncached tokens this attempt added to the replica's queue
    first_token_seen: bool = False


PREPARED_MAX = 1024  # prompts hashed ahead and not yet planned (a plan normally follows at once)
SETTLE_WAIT_S = 0.005  # how long `prepare` waits for the records before it (see the module docstring)
MAX_PENDING_RECORDS = 64  # deferred records queued before a caller applies its own inline
INLINE_RECORD_BLOCKS = 128  # a chain this short is applied at once when nothing is queued (~0.08 ms)


def policy_options(cfg: RoutingConfig) -> dict[str, Any]:
    if cfg.policy == "cache_aware":
        return {"decode_weight": cfg.decode_weight, "miss_weight": cfg.miss_weight, "queue_slack": cfg.queue_slack,
                "prompt_slack": cfg.prompt_slack, "session_slack": cfg.session_slack}
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
        self.hasher: PromptHasher | None = hasher
        if self.hasher is None and cfg.mode == "approximate":
            self.hasher = PromptHasher(load_tokenizer(cfg.tokenizer), cfg.block_size or 16, seed=cfg.seed)
        self.index = index or PrefixIndex(cfg.capacity_blocks, touch_on_match=cfg.mode == "precise")
        for r in replicas:
            if r.name not in self.index.replicas:
                self.index.add_replica(r.name, r.capacity_blocks or cfg.capacity_blocks)
        self.policy = policy or make_policy(cfg.policy, **policy_options(cfg))
        self._clock = clock
        self._lock = threading.Lock()
        # prompts hashed ahead by `prepare`, waiting for `plan` of the same list object (held, so
        # its id cannot be reused meanwhile); bounded in case a plan never comes
        self._prepared: OrderedDict[int, tuple[Sequence[dict[str, Any]], PromptHashes, dict[str, int]]] = OrderedDict()
        # approximate mode's records, off the caller's thread (see the module docstring)
        self._recorder = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvgate-index")
                          if defer_records and cfg.mode == "approximate" else None)
        self._last_record: Future[None] | None = None
        self._pending_records = 0  # submitted, not yet applied (under _pending_lock)
        self._pending_lock = threading.Lock()
        self._names = frozenset(r.name for r in self.replicas)
        self.state: RoutingState = state or LocalState([r.name for r in replicas])
        if cfg.mode == "approximate":
            self.state.follow(self._apply_peer)
        # what each replica's engine said of itself (middleware.engines), once it answered
        self.book = EngineBook(name, cfg.engine, cfg.cache_salt, salter, self._engine_found)
        self.precise: PreciseRouting | None = None
        if cfg.mode == "precise":
            self.precise = PreciseRouting(name, cfg, self.index, list(replicas), self._use_hasher, clock)

    def _use_hasher(self, hasher: PromptHasher) -> None:
        """Precise mode: the engines' block size and tokenizer are known (again): hash with them."""
        self.hasher = hasher

    @property
    def block_size(self) -> int:
        return self.hasher.block_size if self.hasher is not None else (self.cfg.block_size or 1)

    def close(self) -> None:
        if self._recorder is not None:
            self._recorder.shutdown(wait=True)
        if self.precise is not None:
            self.precise.close()
        self.state.close()

    # ------------------------------------------------------------------ engines
    @property
    def engines(self) -> dict[str, EngineInfo]:
        return self.book.engines

    @property
    def discovered(self) -> bool:
        return not self.book.missing([r.name for r in self.replicas])

    async def discover(self, client: httpx.AsyncClient | None = None) -> None:
        """Ask every replica not yet described what engine it runs (middleware.engines)."""
        await self.book.discover([(r.name, r.api_base) for r in self.replicas], client)

    def _engine_found(self, name: str, info: EngineInfo) -> None:
        if self.precise is not None and name in self._names:
            self.precise.engine_found(name, info)

    def salt(self, tenant: str | None, client_salt: object = None) -> str | None:
        """The cache_salt of a request of `tenant` (EngineBook.salt); part of its hashes too."""
        return self.book.salt(tenant, client_salt)

    def _apply_peer(self, replica: str, hashes: list[int]) -> None:
        """Another proxy process routed this chain to `replica` (approximate mode)."""
        if replica in self._names:
            self.index.record(replica, hashes)

    def refresh_load(self, replicas: Sequence[ReplicaState] | None = None) -> None:
        """Copy the shared load (every process's) into the replica states the policies read."""
        for r in self.replicas if replicas is None else replicas:
            r.in_flight, r.pending_prefill_tokens = self.state.load(r.name)

    # ------------------------------------------------------------------ decisions
    def prepare(self, messages: Sequence[dict[str, Any]], salt: str | None = None) -> None:
        """Hash and match a prompt ahead of its `plan` (thread-safe; meant for a worker thread).

        With deferred records, hashing stops soon after a block no replica holds (a match
        cannot pass it); the recorder hashes the rest before recording the chain (`started`), off
        the request's path. If a record lands meanwhile and some replica holds every block hashed
        so far, the rest is hashed here and matched again, so the match is always the full one."""
        hasher = self.hasher
        if hasher is None:
            return
        prompt = hasher.prompt(messages, until=self.index.held if self._recorder is not None else None, salt=salt)
        self.settle(SETTLE_WAIT_S)
        matched = self.index.match(prompt.hashes)
        if prompt.partial and max(matched.values(), default=0) >= len(prompt.hashes):
            matched = self.index.match(prompt.complete().hashes)
        with self._lock:
            self._prepared[id(messages)] = (messages, prompt, matched)
            while len(self._prepared) > PREPARED_MAX:
                self._prepared.popitem(last=False)

    def _take_prepared(self, messages: Sequence[dict[str, Any]]) -> tuple[PromptHashes, dict[str, int]] | None:
        with self._lock:
            held = self._prepared.pop(id(messages), None)
        return (held[1], held[2]) if held is not None and held[0] is messages else None

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until the records submitted so far are in the index, at most `timeout` seconds
        (None: however long). True when they are (at once when not deferred)."""
        last = self._last_record
        if last is None:
            return True
        done, _ = wait([last], timeout=timeout)
        return bool(done)

    def plan(self, messages: Sequence[dict[str, Any]], session: str | None = None, salt: str | None = None) -> RoutePlan:
        if session is None and messages:
            first = messages[0].get("content")
            session = first if isinstance(first, str) else None
        hasher = self.hasher
        if hasher is None:  # precise mode before the engines said how to hash: route by load
            return RoutePlan([], 0, self.block_size, {}, session, salt=salt)
        ready = self._take_prepared(messages)
        if ready is None:  # not prepared: computed here, on the caller's thread, without waiting
            prompt = hasher.prompt(messages, salt=salt)
            ready = (prompt, self.index.match(prompt.hashes))
        prompt, matched = ready
        return RoutePlan(prompt.hashes, prompt.tokens, hasher.block_size, matched, session,
                         shared_prefix=self.index.shared_match(prompt.hashes, matched), prompt=prompt, salt=salt)

    def _record(self, replica: str, hashes: list[int] | PromptHashes) -> None:
        """Approximate mode: `replica` now caches this chain (in order, off this thread if deferred).
        A partial prompt's chain is hashed to its end by whoever applies the record."""
        if self._recorder is not None:
            blocks = hashes.blocks if isinstance(hashes, PromptHashes) else len(hashes)
            with self._pending_lock:
                # a short chain with nothing before it in the queue stays in order applied here
                queued = (self._pending_records < MAX_PENDING_RECORDS
                          and (self._pending_records > 0 or blocks > INLINE_RECORD_BLOCKS))
                self._pending_records += queued
            if queued:
                try:
                    self._last_record = self._recorder.submit(self._deferred_record, replica, hashes)
                    return
                except RuntimeError:  # closed: a request finishing while the proxy shuts down
                    with self._pending_lock:
                        self._pending_records -= 1
        self._apply_record(replica, hashes)

    def _deferred_record(self, replica: str, hashes: list[int] | PromptHashes) -> None:
        try:
            self._apply_record(replica, hashes)
        finally:
            with self._pending_lock:
                self._pending_records -= 1

    def _apply_record(self, replica: str, chain: list[int] | PromptHashes) -> None:
        try:
            hashes = chain.complete().hashes if isinstance(chain, PromptHashes) else chain
            self.index.record(replica, hashes)
            self.state.recorded(replica, hashes)
        except Exception:  # a record lost costs a worse route later, never the request
            log.exception("route record for replica %s failed", replica)

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
            self.refresh_load(candidates)
            return self.policy.choose(candidates, plan)

    # ------------------------------------------------------------------ bookkeeping
    def started(self, replica: ReplicaState, plan: RoutePlan) -> Ticket:
        pending = max(0, plan.prompt_tokens - plan.matched_tokens(replica.name))
        with self._lock:
            self.state.add_load(replica.name, 1, pending)
            replica.in_flight += 1
            replica.requests += 1
            replica.pending_prefill_tokens += pending
        if self.cfg.mode == "approximate":
            self._record(replica.name, plan.prompt if plan.prompt is not None and plan.prompt.partial else plan.hashes)
        elif self.precise is not None:
            self.precise.sent(replica.name, plan.hashes)
        return Ticket(replica, plan, pending)

    def first_token(self, ticket: Ticket) -> None:
        with self._lock:
            if not ticket.first_token_seen:
                ticket.first_token_seen = True
                self.state.add_load(ticket.replica.name, 0, -ticket.pending)
                ticket.replica.pending_prefill_tokens -= ticket.pending

    def finished(self, ticket: Ticket, ok: bool, conversation: Sequence[dict[str, Any]] | None = None) -> None:
        """The attempt ended. On success the replica is healthy; in approximate mode the blocks of
        prompt + answer (`conversation`) are now in its cache, ready for the next turn."""
        self.first_token(ticket)
        with self._lock:
            self.state.add_load(ticket.replica.name, -1, 0)
            ticket.replica.in_flight -= 1
            if ok:
                ticket.replica.healthy, ticket.replica.failures = True, 0
        if self.precise is not None:
            self.precise.check()
        if ok and conversation is not None and self._records_answers:
            self._record(ticket.replica.name, self._conversation_hashes(ticket.plan, conversation))

    @property
    def _records_answers(self) -> bool:
        return self.cfg.mode == "approximate" and self.cfg.record_answers

    def prepare_answer(self, plan: RoutePlan, conversation: Sequence[dict[str, Any]]) -> None:
        """Hash prompt + answer ahead of `finished` (thread-safe; meant for a worker thread)."""
        hasher = self.hasher
        if self._records_answers and conversation and hasher is not None:
            plan.answer = (dict(conversation[-1]), hasher.prompt(conversation, plan.prompt, salt=plan.salt).hashes)

    def _conversation_hashes(self, plan: RoutePlan, conversation: Sequence[dict[str, Any]]) -> list[int]:
        """prompt + answer's hashes: ready if `prepare_answer` saw this answer, else worked out
        here, resuming from the prompt's own chain states (only the answer is tokenised)."""
        ready = plan.answer
        if ready is not None and len(conversation) and conversation[-1] == ready[0]:
            return ready[1]
        hasher = self.hasher
        return hasher.prompt(conversation, plan.prompt, salt=plan.salt).hashes if hasher is not None else []

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
        """One health round: GET {api_base}/models on every down replica; 200 re-admits it. A
        replica refusing connections has no engine behind it, so (precise mode) no cache: its
        view is dropped, and its engine is asked again what it is once it answers (a restart
        may bring another version or block size)."""
        for replica in [r for r in self.replicas if not r.healthy]:
            try:
                resp = await client.get(f"{replica.api_base.rstrip('/')}/models", timeout=2.0)
                if resp.status_code == 200:
                    self.mark_up(replica)
            except httpx.ConnectError:
                self.engine_gone(replica.name)
            except httpx.HTTPError:
                pass
        if self.precise is not None:
            self.precise.check()

    def engine_gone(self, name: str) -> None:
        """The replica's engine process is gone: forget its cache and what it said of itself."""
        self.book.forget(name)
        if self.precise is not None and self.index.blocks(name):
            log.warning("route %s: replica %s refuses connections; its %d blocks leave the prefix index",
                        self.name, name, self.index.blocks(name))
            self.precise.drop(name)

    def event_stats(self) -> dict[str, FeedStats]:
        """Per replica, its KV-event feed's counters (precise mode; empty otherwise)."""
        if self.precise is None:
            return {}
        return {name: sub.feed.stats() for name, sub in list(self.precise.subscribers.items())}

    def stats(self) -> dict[str, Any]:
        with self._lock:
            self.refresh_load()
        precise = self.precise.stats() if self.precise is not None else {}
        out: dict[str, Any] = {}
        for r in self.replicas:
            out[r.name] = {"healthy": r.healthy, "in_flight": r.in_flight, "requests": r.requests,
                           "pending_prefill_tokens": r.pending_prefill_tokens, "blocks": self.index.blocks(r.name)}
            engine = self.book.describe(r.name)
            if engine is not None:
                out[r.name]["engine"] = engine
            if r.name in precise:
                out[r.name]["precise"] = precise[r.name]
        return out

    # ------------------------------------------------------------------ replicas at run time
    # (the admin API, middleware/admin.py). Lists are replaced, never changed in place, so a
    # reader iterating a snapshot (candidates, probe, the metrics collector) stays safe.
    def add_replica(self, cfg: ReplicaConfig) -> ReplicaState:
        """Route to one more replica from now on. ValueError: the name is on this route already,
        precise mode without `events`, or a routing state that cannot count a new name (WorkerState:
        its shared load table is laid out at start-up)."""
        if self.cfg.mode == "precise" and not cfg.events:
            raise ValueError(f"routing.mode precise needs replicas[].events (a ZMQ endpoint) for: {[cfg.name]}")
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
                self.index.add_replica(cfg.name, cfg.capacity_blocks or self.cfg.capacity_blocks)
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
        self.index.remove_replica(name)
