"""The response cache of a pipeline: look a request up (exact, then semantic), serve a hit, and
record a miss's answer (the entry, the request-log record, the metrics).

The pipeline runs these steps where they belong: what grows with the prompt (canonical keys, the
exact-tier read, embedding + search) in its one worker-thread hop, unless it is small and bounded
(kvgate.middleware.cache.offload): then the hop would cost more than the work, and the step runs on
the loop, a record step's writes committed with the other inline steps of the same loop turn
(kvgate.middleware.cache.group_commit). Nothing here knows of forwarding or routing.

Invariant: an answer is written only when the request allows it (no no-store) and it is complete
(`cacheable`); a hit never leaves its scope (route, model, output-affecting parameters, history,
tenant: kvgate.middleware.request).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator

import numpy as np

from kvgate.index.responses.semantic import CacheEntry, SemanticIndex
from kvgate.index.storage.softfail import Batch
from kvgate.middleware.answers import Replay, cacheable, cost, replayed, served_response, tag, wire_body, wire_events
from kvgate.middleware.cache.feedback import FeedbackOutcome, give_feedback
from kvgate.middleware.cache.group_commit import GroupCommit, Settle
from kvgate.middleware.cache.request_log import RequestLog, RequestRecord
from kvgate.middleware.cache.semantic_lookup import SemanticLookup, count_lookup
from kvgate.middleware.config import Config, RouteConfig
from kvgate.middleware.errors import RequestNotFound
from kvgate.middleware.outcome import CacheInfo, Hit, Lookup, Result
from kvgate.middleware.request import CacheControl, RequestView, build_text_view, build_view
from kvgate.middleware.tags import entry_tags
from kvgate.middleware.telemetry.metrics import Metrics
from kvgate.middleware.text_answers import json_body, replay_events, served_text, stream_objects

UNPRICED_MODELS = 1024  # bound on the models remembered as unpriced (request models can be anything)


@dataclass
class Looked:
    """A request after its lookup: the served hit (`result`), or what its miss needs."""

    view: RequestView
    lookup: Lookup
    inline: bool  # its cache steps run on the event loop
    started: float
    result: Result | None = None
    # perf_counter stamps of the look-up step (steps.look_up): its start, the tiers looked up, the
    # prompt's prefix matched; for the Server-Timing header (middleware/server/timing.py)
    spans: tuple[float, float, float] | None = None


class ResponseCache:
    """Owns the response index, the request log and the semantic tier; shared across requests."""

    def __init__(
        self,
        config: Config,
        index: SemanticIndex,
        requests: RequestLog,
        semantic: SemanticLookup,
        metrics: Metrics,
        inline_chars: dict[str, int | None],
        transactional: bool = True,
    ) -> None:
        self.config = config
        self.index = index
        self.requests = requests
        self.keeps_ids = config.feedback.enabled  # false: no request-log record is made at all
        self.semantic = semantic
        self.metrics = metrics
        self.inline_chars = inline_chars  # per route: the prompt size up to which cache steps run inline
        # the stores commit a batch's writes together (local files); over the network (Redis)
        # each write is its own call, and a batch would only hold the index's lock across them
        self.transactional = transactional
        self.commits = GroupCommit(self._write_batch)  # inline record steps, a batch per loop turn
        # inline hits' request-log records, a batch per loop turn of the log alone: a hit writes
        # no entry, and an empty transaction of the index would count as the store working
        self.log_commits = GroupCommit(self._log_batch)
        self._batching = threading.local()  # `active`: this thread runs a group commit's batch
        self._unpriced: set[str] = set()  # models LiteLLM's price map does not know (see `store`)

    def close(self) -> None:
        self.index.close()
        self.requests.close()

    # ------------------------------------------------------------------ lookup
    def view(
        self,
        route: RouteConfig,
        kwargs: dict[str, Any],
        tenant: str = "anonymous",
        control: CacheControl | None = None,
        endpoint: str = "chat",
    ) -> RequestView:
        """The request view of a chat request, or of one completions prompt (`endpoint`
        completions), on the route the pipeline matched for it."""
        build = build_text_view if endpoint == "completions" else build_view
        return build(self.config, kwargs, tenant, control or CacheControl(), route)

    def look_up(self, view: RequestView, started: float, inline: bool, raw: bool = False) -> Looked:
        """The exact tier, then the semantic tier; a hit is served from here (`Looked.result`).
        `inline`: the caller runs this step on the event loop (and so the record step, when the
        answer is small too). `raw`: the caller (the proxy) sends a hit's bytes as they are."""
        hit = self.lookup_exact(view)
        found = Lookup(hit) if hit else self.semantic.look_up(view)
        if found.hit:  # inline, its request-log record waits for the loop turn's group commit (`logged`)
            return Looked(view, found, inline, started, self.served(view, found.hit, started, raw, log=not inline))
        return Looked(view, found, inline, started)

    async def logged(self, looked: Looked) -> None:
        """An inline hit's request-log record, written with the other inline hits' of this loop
        turn: one row in the log's batch rather than a lone `set` (a read, the write and a cull,
        committed on its own). Awaited before the hit is answered, so its request id can be
        judged as soon as the client has it."""
        if not (looked.inline and looked.result is not None):
            return
        if looked.view.route.caches and self.keeps_ids:
            await self.log_commits.run(self._log_hit, looked.view, looked.result.info)
        else:  # no record to wait for: still let the loop serve its other ready sockets first, as
            await asyncio.sleep(0)  # a hit with one does, so a run of hits does not hold the loop

    def _log_hit(self, view: RequestView, info: CacheInfo) -> Settle:
        self.remember(view, info)
        return _nothing_to_count

    def lookup_exact(self, view: RequestView) -> Hit | None:
        if view.control.no_cache or not view.route.exact:
            return None
        started = time.perf_counter()
        entry = self.index.get_exact(view.exact_key)
        count_lookup(self.metrics, view, "exact", started, entry is not None)
        return Hit(entry, "exact") if entry else None

    def served(self, view: RequestView, hit: Hit, started: float, raw: bool = False, log: bool = True) -> Result:
        """A hit as the caller takes it; with `raw` (the proxy), a chat answer is its stored JSON
        (the miss's own body for a relayed one), or that answer's chunks as SSE bytes, rather
        than LiteLLM's objects. `log`: its request-log record is written here (else by `logged`)."""
        info = CacheInfo(
            hit.tier,
            view.route.name,
            hit.similarity,
            hit.entry.id,
            entry_age_s=max(0.0, time.time() - hit.entry.created),
            timing=(started,),
        )
        if log:
            self.remember(view, info)
        stored = hit.entry.response
        route = view.route.name
        self.metrics.requests.labels(route, hit.tier).inc()
        usage = stored.get("usage") or {}
        self.metrics.tokens_saved.labels(route).inc(int(usage.get("total_tokens") or 0))
        saved = stored.get("_kvgate_cost_usd")
        if saved:
            self.metrics.cost_saved.labels(route).inc(float(saved))
        self.metrics.latency.labels(route, hit.tier).observe(time.perf_counter() - started)
        if view.completions:
            return self._served_text(view, info, stored, started)
        if not view.stream:
            if raw:
                return Result(info, raw=wire_body(stored))
            return Result(info, response=served_response(stored, info))
        include_usage = bool((view.forwarded.get("stream_options") or {}).get("include_usage"))
        # the replay is in memory: its first chunk goes out as soon as the lookup is done
        self.metrics.ttft.labels(route, hit.tier).observe(time.perf_counter() - started)
        if raw:
            return Result(info, raw=_events(wire_events(stored, include_usage)))
        return Result(info, stream=replayed(stored, info, include_usage))

    def _served_text(self, view: RequestView, info: CacheInfo, stored: dict[str, Any], started: float) -> Result:
        """A completions hit: LiteLLM's objects for the SDK, the JSON body or the SSE events
        (byte for byte those of a streamed miss) for the proxy."""
        if not view.stream:
            response = served_text(stored)
            tag(response, info)
            return Result(info, response=response, raw=json_body(stored))
        include_usage = bool((view.forwarded.get("stream_options") or {}).get("include_usage"))
        self.metrics.ttft.labels(view.route.name, info.cache).observe(time.perf_counter() - started)
        return Result(
            info,
            stream=Replay(_tagged(stream_objects(stored, include_usage), info)),
            raw=_events(replay_events(stored, include_usage)),
        )

    # ------------------------------------------------------------------ record
    def stores(self, view: RequestView) -> bool:
        """Whether this request's answer will be written anywhere."""
        return not view.control.no_store and (
            view.route.exact or (view.route.semantic.enabled and view.query_text is not None)
        )

    def _ready(
        self, view: RequestView, response: dict[str, Any], vector: np.ndarray | None, model: str
    ) -> tuple[dict[str, Any], np.ndarray | None] | None:
        """What `_write` stores (the answer priced, its vector on a semantic route), or None when
        nothing is stored: no-store, or an unfinished answer (counted as skipped). `model`: what
        the miss was sent as (its price). Slow parts (a price look-up, an embedding) run here,
        before any store's lock or transaction is taken."""
        if not self.stores(view) or not cacheable(response):
            self.metrics.stores.labels(view.route.name, "skipped").inc()
            return None
        semantic = view.route.semantic.enabled and view.query_text is not None
        # LiteLLM's price lookup costs more than the rest of a store; a model it cannot price is asked once
        price = None if model in self._unpriced else cost(response, model)
        if price is None and len(self._unpriced) < UNPRICED_MODELS:
            self._unpriced.add(model)
        if price:
            response = {**response, "_kvgate_cost_usd": price}
        if semantic and vector is None:
            vector = self.semantic.embed(view.query_text)  # type: ignore[arg-type]
        return response, vector if semantic else None

    def _write(self, view: RequestView, ready: tuple[dict[str, Any], np.ndarray | None]) -> CacheEntry | None:
        """The entry of `_ready`'s answer; None: the cache could not write (disk full, damaged
        store), and the answer is served anyway."""
        response, vector = ready
        return self.index.add(
            view.scope,
            response,
            exact_key=view.exact_key if view.route.exact else None,
            text=view.query_text or "",
            vector=vector,
            ttl=view.control.ttl or view.route.ttl,
            route=view.route.name,
            model=view.model,
            parents=list(view.parents) if view.parents is not None else None,
            tenant=view.tenant,
            tags=entry_tags(view),
        )

    # ------------------------------------------------------------------ a miss
    def miss(self, looked: Looked, replica: str | None, expected_cached_tokens: int | None) -> CacheInfo:
        """The miss's CacheInfo, once a replica answers."""
        return CacheInfo(
            "miss",
            looked.view.route.name,
            replica=replica,
            exploration=looked.lookup.explore,
            expected_cached_tokens=expected_cached_tokens,
            skipped=looked.view.skip,
        )

    def first_token(self, looked: Looked) -> None:
        """The miss's first bytes go to the client now."""
        self.metrics.ttft.labels(looked.view.route.name, "miss").observe(time.perf_counter() - looked.started)

    def records_inline(self, looked: Looked, answer: str | None) -> bool:
        """Whether a miss's record step runs on the loop: its look-up did, and its answer (hashed
        after the prompt for the router's records in the same step) is held to the same
        new-characters bound."""
        return looked.inline and len(answer or "") <= (self.inline_chars[looked.view.route.name] or 0)

    def record(
        self,
        looked: Looked,
        info: CacheInfo,
        answer: str | None,
        payload: Callable[[], dict[str, Any] | None],
        model: str,
    ) -> Settle:
        """After a complete answer, in a worker thread or a group commit: the cache write (of
        `payload()`, asked only when the request stores; `model`: what the miss was sent as, its
        price), the request-log record, the metrics; what it returns counts the write once its
        fate is known."""
        view = looked.view
        body = payload() if self.stores(view) else None
        ready = self._ready(view, body, looked.lookup.vector, model) if body else None
        with self._own_batch(ready is not None) as own:  # nothing to store: the record alone (`remember`)
            entry = self._write(view, ready) if ready is not None else None
            info.stored = entry is not None
            if entry is not None:
                info.entry_id = entry.id
            self.remember(view, info)
        lost_here = own is not None and own.lost  # the step's own batch failed to commit
        route = view.route.name
        self.metrics.requests.labels(route, "miss").inc()
        self.metrics.latency.labels(route, "miss").observe(time.perf_counter() - looked.started)
        self.semantic.explored(view, info.exploration, answer)

        def settle(lost: bool) -> None:  # `lost`: the group commit's batch failed to commit
            if ready is not None:
                stored = entry is not None and not (lost or lost_here)
                self.metrics.stores.labels(route, "stored" if stored else "failed").inc()

        return settle

    async def step(self, inline: bool, fn: Callable[..., Settle], *args: Any, writes: bool = True) -> None:
        """`fn(*args)` on the loop, committed with the other inline steps of this turn, when the
        request runs inline (at once when it `writes` nothing: no batch to commit); else in a
        worker thread."""
        if inline and not writes:
            fn(*args)(False)
        elif inline:
            await self.commits.run(fn, *args)
        else:
            settle = await asyncio.to_thread(fn, *args)
            settle(False)  # its writes committed one by one

    @contextlib.contextmanager
    def _write_batch(self) -> Iterator[Batch]:
        with self.index.batch() as batch, self.requests.batch(), self._batching_here():
            yield batch  # a lost request-log batch is the log's to count: the answers' fate is the index's

    @contextlib.contextmanager
    def _log_batch(self) -> Iterator[Batch]:
        with self.requests.batch() as batch, self._batching_here():
            yield batch if isinstance(batch, Batch) else Batch()  # a log without transactions: nothing to lose

    @contextlib.contextmanager
    def _batching_here(self) -> Iterator[None]:
        """Marks this thread as inside a batch, whose end commits the writes made meanwhile."""
        self._batching.active = True
        try:
            yield
        finally:
            self._batching.active = False

    def _in_batch(self) -> bool:
        return getattr(self._batching, "active", False)

    def _own_batch(self, writes: bool) -> contextlib.AbstractContextManager[Batch | None]:
        """A record step's writes outside a group commit (a worker thread's step, on a store with
        transactions) in a batch of their own: the entry's rows and the request-log record one
        transaction per store, the steps of concurrent threads taking the index's lock in turn
        for their writes only (the answer is priced and embedded before). Inside a group commit's
        batch, with no entry to write, or on a store without transactions: none (None)."""
        if not writes or not self.transactional or self._in_batch():
            return contextlib.nullcontext(None)
        return self._write_batch()

    def remember(self, view: RequestView, info: CacheInfo) -> None:
        """Log what this request id was served from / stored as, for feedback (on a route that
        caches answers, `RouteConfig.caches`: elsewhere there is nothing to judge; and only while
        `feedback.enabled`)."""
        if not view.route.caches or not self.keeps_ids:
            return
        record = RequestRecord(view.tenant, view.route.name, info.cache, view.scope, info.entry_id, info.similarity)
        if self._in_batch():  # a group commit's step: its batch commits the record
            self.requests.record(info.request_id, record)
            return
        # a worker thread's step: one row in a transaction of its own, where a lone `set` would
        # add a read and a cull of expired rows to the write
        with self.requests.batch():
            self.requests.record(info.request_id, record)

    # ------------------------------------------------------------------ feedback
    def feedback(self, request_id: str, correct: bool, tenant: str = "anonymous") -> FeedbackOutcome:
        """Judge an earlier answer (see middleware/cache/feedback.py); RequestNotFound if not this
        tenant's, or when this proxy keeps no request ids (`feedback.enabled: false`)."""
        if not self.keeps_ids:
            raise RequestNotFound(
                f"no request {request_id!r} to give feedback on: this proxy keeps no request ids "
                "(feedback.enabled is false in its config)",
                param="request_id",
            )
        record = self.requests.get(request_id)
        route = next((r for r in self.config.routes if record is not None and r.name == record.route), None)
        mark_ttl = route.ttl if route is not None else None
        outcome = give_feedback(self.index, self.requests, self.metrics, request_id, correct, tenant, mark_ttl)
        trust = self.semantic.trust
        verified = (
            route is not None and trust is not None and self.semantic.settings[route.name].max_error_rate is not None
        )
        if (
            verified
            and record is not None
            and record.tier == "semantic"
            and record.entry_id is not None
            and record.similarity is not None
        ):  # a verdict on a served hit: an observation like an exploration's
            trust.observe(route.name, record.entry_id, record.similarity, correct, mark_ttl)  # type: ignore[union-attr]
        return outcome


def _nothing_to_count(lost: bool) -> None:
    """A hit's record step: a lost request-log record is the log's to count."""


def _tagged(chunks: Iterator[Any], info: CacheInfo) -> Iterator[Any]:
    for chunk in chunks:
        tag(chunk, info)
        yield chunk


async def _events(events: list[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event
