"""The request pipeline: route → exact tier → semantic tier → backend (LiteLLM) → store.

No HTTP here: the proxy and the SDK both call `acomplete` / `complete` with LiteLLM-style kwargs
and get back litellm response objects (or chunk iterators) plus a CacheInfo. The flow is written
once, async; `complete` is a thin sync adapter that runs it on the pipeline's own loop thread
(middleware.sync_adapter). Blocking work (embedding, FAISS search, disk writes) runs in threads,
and so does everything that grows with the prompt (request keys, the exact-tier read, routing
hashes, the request-log write): one worker-thread hop before the backend call, one after.

Long module: the request flow is kept in one place on purpose; each decision it makes lives
elsewhere (verification, trust_gate, answers, request, relay).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any, AsyncIterator, Callable, Iterator

import numpy as np

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the price list at import
import litellm  # noqa: E402

litellm.suppress_debug_info = True  # its banners go to stdout; our errors say what failed
from litellm.types.utils import ModelResponseStream  # noqa: E402

from index.embedder import Embedder, make_embedder  # noqa: E402
from index.semantic import CacheEntry, SemanticIndex  # noqa: E402
from index.softfail import Batch  # noqa: E402
from index.tighten import threshold_for  # noqa: E402
from index.verifier import Verifier, VerifierMissing, load_verifier  # noqa: E402
from middleware.answers import (  # noqa: E402
    Replay, answer_text, assemble, cacheable, cost, replayed, served_response, streamed_text, tag,
)
from middleware.backend import Backend, Call  # noqa: E402
from middleware.config import Config, RouteConfig  # noqa: E402
from middleware.errors import BackendError, ConfigError  # noqa: E402
from middleware.feedback import FeedbackOutcome, give_feedback  # noqa: E402
from middleware.group_commit import GroupCommit, Settle  # noqa: E402
from middleware.metrics import Metrics  # noqa: E402
from middleware.offload import INLINE_TOTAL_CHARS, new_chars_limit, prompt_chars, runs_inline  # noqa: E402
from middleware.parents import PARENT_SEARCH_K, PARENT_THRESHOLD, same_parents  # noqa: E402
from middleware.outcome import CacheInfo, Hit, Lookup, Result, Tier  # noqa: E402,F401  (CacheInfo, Result: public here too)
from middleware.relay import DONE, Relay, Relayed  # noqa: E402
from middleware.request_log import RequestLog, RequestRecord  # noqa: E402
from middleware.store import open_observations, open_stores  # noqa: E402
from middleware.routing.router import Router  # noqa: E402
from middleware.routing.salt import Salter, load_secret  # noqa: E402
from middleware.routing.state import StateFactory  # noqa: E402
from middleware.routing.state_redis import shared_routing  # noqa: E402
from middleware.request import CacheControl, RequestView, build_view  # noqa: E402
from middleware.sync_adapter import SyncAdapter  # noqa: E402
from middleware.trust_gate import Exploration, TrustGate  # noqa: E402
from middleware.verification import SemanticSettings, choose, resolve, to_verify  # noqa: E402

ENGINE_PROBE_S = 3.0  # how long a route's first request waits to learn its replicas' engines

log = logging.getLogger("kvgate.pipeline")
MINILM_DIM = 384
UNPRICED_MODELS = 1024  # bound on the models remembered as unpriced (request models can be anything)


class Pipeline:
    """Owns the embedder, the semantic index and the metrics; safe to share across requests."""

    def __init__(
        self,
        config: Config,
        *,
        embedder: Embedder | None = None,
        index: SemanticIndex | None = None,
        metrics: Metrics | None = None,
        verifier: Verifier | None = None,
        routing_state: StateFactory | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        # thresholds from the config or from `kvgate tune`'s operating point, resolved once (ConfigError if missing)
        self.semantic = {r.name: resolve(r, config.cache_dir, i) for i, r in enumerate(config.routes)}
        # the verifier model loads only when a semantic route uses it
        verifying = [i for i, r in enumerate(config.routes) if r.semantic.enabled and self.semantic[r.name].verifies]
        self.verifier: Verifier | None = verifier or (_load_verifier(config, verifying[0]) if verifying else None)
        semantic = any(r.semantic.enabled for r in config.routes)
        # no semantic route, no model to load (saves ~5 s of start-up and its memory)
        self.embedder: Embedder | None = embedder or (
            _make_embedder(config) if semantic else None
        )
        dim = self.embedder.dim if self.embedder is not None else MINILM_DIM
        # `store:` local dirs or a shared Redis (middleware.store); the index follows the store's log
        stores = open_stores(config, dim, with_entries=index is None)
        self.index = index or SemanticIndex(None, dim, max_entries=config.max_entries, entries=stores.entries,
                                            tighten_margin=config.feedback.margin, max_bytes=config.max_bytes,
                                            follow_interval_s=stores.follow_interval_s)
        self.requests: RequestLog = stores.requests
        # on Redis, the routing view is shared with every proxy process on it (one host's workers included)
        self._routing_hub = shared_routing(config, stores.link)
        routing_state = self._routing_hub.state if self._routing_hub is not None else routing_state
        self.metrics.entries.set_function(lambda: len(self.index))
        self.metrics.cache_bytes.set_function(lambda: self.index.bytes)
        salter = _salter(config)
        self._engines_known = False  # every route's replicas said what engine they run (_know_engines)
        self.backends = {route.name: Backend(route, _router_for(route, routing_state, salter), self.metrics)
                         for route in config.routes}
        # per route: the prompt size up to which its cache steps run on the event loop (middleware.offload)
        self._inline_chars = {r.name: new_chars_limit(local_stores=stores.link is None, semantic=r.semantic.enabled,
                                                      tokenizer=r.routing.tokenizer if r.replicas else None)
                              for r in config.routes}
        self.relay = Relay()  # the proxy's pass-through to OpenAI-compatible replicas (middleware.relay)
        self.commits = GroupCommit(self._write_batch)  # inline record steps, a batch per loop turn
        self._unpriced: set[str] = set()  # models LiteLLM's price map does not know (see `store`)
        for name, router in self.routers.items():
            for replica in router.replicas:
                self.metrics.replica_up.labels(name, replica.name).set_function(lambda r=replica: float(r.healthy))
        self.metrics.watch(self.routers, {"responses": self.index, "request_log": self.requests})
        self.metrics.watch_store(stores.link, self.index.follow_lag_s)
        # routes with semantic.max_error_rate: verified outcomes live next to the entries (shared, kept)
        self.trust: TrustGate | None = None
        if any(r.semantic.enabled and self.semantic[r.name].max_error_rate is not None for r in config.routes):
            self.trust = TrustGate(open_observations(config, stores.link), self._embed_many,
                                   lambda route, ok: self.metrics.exploration_verdicts.labels(
                                       route, "agree" if ok else "differ").inc())
        self._sync = SyncAdapter()  # the sync face's own loop, started by the first `complete`

    @property
    def routers(self) -> dict[str, Router]:
        return {name: b.router for name, b in self.backends.items() if b.router is not None}

    def close(self) -> None:
        self._sync.close()  # first: open sync streams end (unstored) while the index is still open
        if self.trust is not None:
            self.trust.close()  # finishes queued comparisons while the index is still open
        for router in self.routers.values():
            router.close()
        if self._routing_hub is not None:
            self._routing_hub.close()
        self.index.close()
        self.requests.close()

    async def aclose(self) -> None:
        """Release what lives on the serving loop (the relay's connection pool); before `close`."""
        await self.relay.aclose()

    # ------------------------------------------------------------------ steps
    def view(self, kwargs: dict[str, Any], tenant: str = "anonymous", control: CacheControl | None = None) -> RequestView:
        return build_view(self.config, kwargs, tenant, control or CacheControl())

    def lookup_exact(self, view: RequestView) -> Hit | None:
        if view.control.no_cache or not view.route.exact:
            return None
        started = time.perf_counter()
        entry = self.index.get_exact(view.exact_key)
        self._count_lookup(view, "exact", started, entry is not None)
        return Hit(entry, "exact") if entry else None

    def lookup_semantic(self, view: RequestView) -> Lookup:
        sem = view.route.semantic
        if view.control.no_cache or not sem.enabled or view.query_text is None:
            return Lookup()
        started = time.perf_counter()
        settings = self.semantic[view.route.name]
        vector = self._embed(view.query_text)
        if view.parents is None:
            found = self.index.search(view.scope, vector, k=settings.candidates)
        else:  # context: semantic: the same follow-up text may close many conversations; keep those whose history matches
            found = same_parents(self._embed_many, view.parents, self.index.search(view.scope, vector, k=PARENT_SEARCH_K),
                                 settings.threshold or PARENT_THRESHOLD)[:settings.candidates]
        if settings.max_error_rate is not None:
            return self._judged(view, settings.max_error_rate, found, vector, started)
        sims = [similarity for _, similarity in found]
        floors = [threshold_for(settings.threshold, entry.min_similarity) for entry, _ in found]
        served = choose(sims, floors, self._verify(view, found, sims, floors, settings), settings)
        hit = Hit(found[served][0], "semantic", found[served][1]) if served is not None else None
        self._count_lookup(view, "semantic", started, hit is not None)
        return Lookup(hit, vector)

    def _judged(self, view: RequestView, delta: float, found: list[tuple[CacheEntry, float]],
                vector: np.ndarray, started: float) -> Lookup:
        """A max_error_rate route: the trust gate serves the nearest candidate or explores it."""
        assert self.trust is not None
        entry, similarity = found[0] if found else (None, 0.0)
        judged = self.trust.judge(view.route.name, delta, entry, similarity, view.control.ttl or view.route.semantic.ttl)
        route = view.route.name
        hit = Hit(entry, "semantic", similarity) if judged.serve and entry is not None else None
        if hit is not None:
            self.metrics.served_wrong_estimate.labels(route).inc(judged.bound)
        if judged.explore is not None:
            self.metrics.explorations.labels(route).inc()
        self._count_lookup(view, "semantic", started, hit is not None)
        return Lookup(hit, vector, judged.explore)

    def _explored(self, view: RequestView, exploration: Exploration | None, answer: str | None) -> None:
        """After an explored miss: the comparison with the cached answer, queued off the response path."""
        if exploration is None or answer is None or self.trust is None:
            return
        forwarded = {**view.params, **view.forwarded}
        deterministic = forwarded.get("temperature") == 0 or forwarded.get("seed") is not None
        self.trust.compare_later(exploration, answer, deterministic)

    def _embed_many(self, texts: list[str]) -> np.ndarray:
        assert self.embedder is not None, "semantic tier used without an embedder"
        return self.embedder.embed(texts)

    def _verify(self, view: RequestView, found: list[tuple[CacheEntry, float]], sims: list[float],
                floors: list[float], settings: SemanticSettings) -> dict[int, float]:
        """Verifier scores of the candidates that passed their cosine floor; counts a rejection
        when there were some and none reaches the verifier threshold."""
        positions = to_verify(sims, floors, settings)
        if not positions or self.verifier is None:
            return {}
        probs = self.verifier.score([(found[i][0].text, view.query_text or "") for i in positions])
        scores = {i: float(p) for i, p in zip(positions, probs)}
        if max(scores.values()) < (settings.verifier_threshold or 0.0):
            self.metrics.verifier_rejections.labels(view.route.name).inc()
        return scores

    def _embed(self, text: str) -> np.ndarray:
        assert self.embedder is not None, "semantic tier used without an embedder"
        return self.embedder.embed([text])[0]

    def stores(self, view: RequestView) -> bool:
        """Whether this request's answer will be written anywhere."""
        return not view.control.no_store and (view.route.exact or (view.route.semantic.enabled and view.query_text is not None))

    def store(self, view: RequestView, response: dict[str, Any], vector: np.ndarray | None) -> tuple[bool, CacheEntry | None]:
        """Write an answer (exact + semantic); skipped on no-store or an unfinished answer.
        (written?, the entry or None when the write failed); the caller counts the outcome once
        the write has committed (the `settle` that `_record` returns)."""
        route = view.route.name
        if not self.stores(view) or not cacheable(response):
            self.metrics.stores.labels(route, "skipped").inc()
            return False, None
        sem = view.route.semantic
        semantic = sem.enabled and view.query_text is not None
        model = self.backends[route].model_for(view)
        # LiteLLM's price lookup costs more than the rest of a store; a model it cannot price is asked once
        price = None if model in self._unpriced else cost(response, model)
        if price is None and len(self._unpriced) < UNPRICED_MODELS:
            self._unpriced.add(model)
        if price:
            response = {**response, "_kvgate_cost_usd": price}
        if semantic and vector is None:
            vector = self._embed(view.query_text)  # type: ignore[arg-type]
        entry = self.index.add(
            view.scope,
            response,
            exact_key=view.exact_key if view.route.exact else None,
            text=view.query_text or "",
            vector=vector if semantic else None,
            ttl=view.control.ttl or sem.ttl,
            route=route,
            model=view.model,
            parents=list(view.parents) if view.parents is not None else None,
        )
        # None: the cache could not write (disk full, damaged store); the answer is served anyway
        return True, entry

    # ------------------------------------------------------------------ async face
    async def acomplete(
        self, kwargs: dict[str, Any], tenant: str = "anonymous", control: CacheControl | None = None,
        *, raw: bool = False,
    ) -> Result:
        """With `raw` (the proxy), a miss on a relayed route comes back as the replica's bytes."""
        started = time.perf_counter()
        await self._know_engines(kwargs)
        # what grows with the prompt (canonical keys, the exact-tier read, embedding + search, the
        # routing hashes) runs in one worker-thread hop, unless it is small and bounded
        # (middleware.offload): then the hops would cost more than the work
        inline = self._inline(kwargs)
        if inline:
            view, found, served = self._look_up(kwargs, tenant, control, started, prepare=False)
        else:
            view, found, served = await asyncio.to_thread(self._look_up, kwargs, tenant, control, started)
        if served is not None:
            return served
        backend = self.backends[view.route.name]
        wire = self.relay.model_for(backend, view) if raw else None
        if wire is not None:
            return await self._relayed(view, wire, found, started, inline)
        call = await self._counted(view, backend.acall(view))
        info = CacheInfo("miss", view.route.name, replica=call.replica, exploration=found.explore,
                         expected_cached_tokens=expected_cached(call))
        if view.stream:
            return Result(info, stream=self._tee(view, info, call, found.vector, started, inline))
        payload = call.response.model_dump()
        answer = answer_text(payload)
        try:
            await self._step(self._inline_record(inline, view, answer), self._record, view, info, call, answer, payload,
                             found.vector, started)
        finally:  # after `_record` worked out the answer's routing hashes: recording them is cheap
            backend.done(call, True, view, answer)
        tag(call.response, info)
        return Result(info, response=call.response)

    async def _know_engines(self, kwargs: dict[str, Any]) -> None:
        """Before a route's first requests: ask its replicas what engine they run (salting and
        precise hashing depend on it); bounded, and a replica that does not answer is asked again
        by the health loop."""
        if self._engines_known:  # the steady state: one read per request
            return
        model = kwargs.get("model")
        route = self.config.match(model) if isinstance(model, str) else None
        router = self.backends[route.name].router if route is not None else None
        if router is not None and not router.discovered:
            try:
                await asyncio.wait_for(router.discover(), ENGINE_PROBE_S)
            except (asyncio.TimeoutError, OSError):
                pass
        self._engines_known = all(r.discovered for r in self.routers.values())

    def _attribute(self, view: RequestView, call: Call, usage: Any) -> None:
        """Expected against reported cached tokens of a miss (kvgate_replica_*_cached_tokens)."""
        ticket = call.ticket
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        reported = details.get("cached_tokens") if isinstance(details, dict) else None
        if ticket is None or not isinstance(reported, int):
            return
        route, name = view.route.name, ticket.replica.name
        expected = ticket.plan.expected_cached_tokens(name)
        self.metrics.expected_cached.labels(route, name).inc(expected)
        self.metrics.reported_cached.labels(route, name).inc(reported)
        if abs(reported - expected) >= max(1, ticket.plan.block_size):
            self.metrics.cache_surprises.labels(route, name, "more" if reported > expected else "less").inc()

    def _inline(self, kwargs: dict[str, Any]) -> bool:
        """Whether this request's cache steps run on the event loop (middleware.offload)."""
        model, messages = kwargs.get("model"), kwargs.get("messages")
        route = self.config.match(model) if isinstance(model, str) else None
        total = prompt_chars(messages)
        if route is None or total < 0:  # the view refuses it at once, wherever it runs
            return True
        limit = self._inline_chars[route.name]
        if limit is None or total > INLINE_TOTAL_CHARS:  # decided before digesting a long prompt
            return False
        router = self.backends[route.name].router
        hasher = router.hasher if router is not None else None
        new = hasher.uncached_chars(messages) if hasher is not None else total
        return runs_inline(total, new, limit)

    async def _step(self, inline: bool, fn: Callable[..., Settle], *args: Any) -> None:
        """`fn(*args)` on the loop, committed with the other inline steps of this turn
        (middleware.group_commit), when the request runs inline; else in a worker thread."""
        if inline:
            await self.commits.run(fn, *args)
        else:
            settle = await asyncio.to_thread(fn, *args)
            settle(False)  # its writes committed one by one

    @contextlib.contextmanager
    def _write_batch(self) -> Iterator[Batch]:
        with self.index.batch() as batch, self.requests.batch():
            yield batch  # a lost request-log batch is the log's to count: the answers' fate is the index's

    def _inline_record(self, inline: bool, view: RequestView, answer: str | None) -> bool:
        """Whether an inline request's record step stays inline: its answer, hashed after the
        prompt for the router's records, is held to the same new-characters bound."""
        return inline and len(answer or "") <= (self._inline_chars[view.route.name] or 0)

    def _look_up(self, kwargs: dict[str, Any], tenant: str, control: CacheControl | None,
                 started: float, prepare: bool = True) -> tuple[RequestView, Lookup, Result | None]:
        """(view, lookup, the served hit or None). With `prepare` (a worker thread), a miss's
        routing hashes are ready for the plan; inline, the plan hashes the small prompt itself
        and never waits for deferred records."""
        view = self.view(kwargs, tenant, control)
        hit = self.lookup_exact(view)
        found = Lookup(hit) if hit else self.lookup_semantic(view)
        if found.hit:
            return view, found, self._served_hit(view, found.hit, started)
        router = self.backends[view.route.name].router
        if router is not None and prepare:
            # the backend's plan of these messages picks it up
            router.prepare(view.messages, salt=self.backends[view.route.name].salt(view))
        return view, found, None

    def _record(self, view: RequestView, info: CacheInfo, call: Call, answer: str | None,
                payload: dict[str, Any] | None, vector: np.ndarray | None, started: float) -> Settle:
        """After a complete answer, in a worker thread or a group commit: the routing hashes of
        prompt + answer (for backend.done), the cache write, the request-log record, the
        metrics; what it returns counts the write once its fate is known."""
        router = self.backends[view.route.name].router
        if router is not None and call.ticket is not None and answer is not None:
            router.prepare_answer(call.ticket.plan, [*view.messages, {"role": "assistant", "content": answer}])
        written, entry = self.store(view, payload, vector) if payload else (False, None)
        self._finish(view, info, entry, started)
        self._explored(view, info.exploration, answer)
        route = view.route.name

        def settle(lost: bool) -> None:  # `lost`: the write's transaction failed to commit
            if written:
                self.metrics.stores.labels(route, "stored" if entry is not None and not lost else "failed").inc()
        return settle

    async def _counted(self, view: RequestView, pending: Any) -> Any:
        try:
            call = await pending
        except BackendError:
            self.metrics.backend_calls.labels(view.route.name, "error").inc()
            raise
        self.metrics.backend_calls.labels(view.route.name, "ok").inc()
        return call

    async def _tee(
        self, view: RequestView, info: CacheInfo, call: Call, vector: np.ndarray | None, started: float,
        inline: bool,
    ) -> AsyncIterator[ModelResponseStream]:
        backend, chunks, ok = self.backends[view.route.name], [], False
        try:
            # resumes on another replica mid-stream; closed with us when the client goes away
            async with contextlib.aclosing(backend.astream(view, call)) as stream:
                async for chunk in stream:
                    if not chunks:
                        self.metrics.ttft.labels(view.route.name, "miss").observe(time.perf_counter() - started)
                    chunks.append(chunk)
                    yield chunk
            ok = True
        except Exception as exc:
            raise backend.error(exc) from exc
        finally:
            if not ok:  # the stream broke or the client went away: never stored
                backend.done(call, False, view, None)
        answer = streamed_text(chunks)
        try:
            await self._step(self._inline_record(inline, view, answer), self._record_stream, view, info, call, answer,
                             chunks, vector, started)
        finally:  # also when the client leaves meanwhile: the replica's books must balance
            backend.done(call, True, view, answer)

    def _record_stream(self, view: RequestView, info: CacheInfo, call: Call, answer: str,
                       chunks: list[ModelResponseStream], vector: np.ndarray | None, started: float) -> Settle:
        payload = assemble(chunks, view.messages) if self.stores(view) else None  # LiteLLM may count prompt tokens
        return self._record(view, info, call, answer, payload, vector, started)

    async def _relayed(self, view: RequestView, wire: str, found: Lookup, started: float, inline: bool) -> Result:
        backend = self.backends[view.route.name]
        vector = found.vector
        relayed = await self._counted(view, self.relay.open(backend, view, wire))
        info = CacheInfo("miss", view.route.name, replica=relayed.call.replica, exploration=found.explore,
                         expected_cached_tokens=expected_cached(relayed.call))
        if view.stream:  # its first event is in: the client's first bytes go out now
            self.metrics.ttft.labels(view.route.name, "miss").observe(time.perf_counter() - started)
            return Result(info, raw=self._relay_tee(view, info, relayed, vector, started, inline))
        assert relayed.payload is not None
        self._attribute(view, relayed.call, relayed.payload.get("usage"))
        answer = answer_text(relayed.payload)
        try:
            await self._step(self._inline_record(inline, view, answer), self._record, view, info, relayed.call, answer,
                        relayed.payload, vector, started)
        finally:
            backend.done(relayed.call, True, view, answer)
        return Result(info, raw=relayed.body)

    async def _relay_tee(
        self, view: RequestView, info: CacheInfo, relayed: Relayed, vector: np.ndarray | None, started: float,
        inline: bool,
    ) -> AsyncIterator[bytes]:
        """A relayed stream's bytes; the answer is stored before [DONE] reaches the client."""
        backend = self.backends[view.route.name]
        try:
            async with contextlib.aclosing(self.relay.stream(backend, view, relayed)) as stream:
                async for blob in stream:
                    yield blob
        finally:
            if not relayed.ok:  # the stream broke or the client went away: never stored
                backend.done(relayed.call, False, view, None)
        if relayed.ok:
            self._attribute(view, relayed.call, relayed.parser.usage if relayed.parser is not None else None)
            try:
                await self._step(self._inline_record(inline, view, relayed.text), self._record_relayed, view, info, relayed,
                            vector, started)
            finally:  # also when the client leaves meanwhile: the replica's books must balance
                backend.done(relayed.call, True, view, relayed.text)
        yield DONE

    def _record_relayed(self, view: RequestView, info: CacheInfo, relayed: Relayed, vector: np.ndarray | None,
                        started: float) -> Settle:
        payload = relayed.answer(view.messages) if self.stores(view) else None  # may rebuild tool calls
        return self._record(view, info, relayed.call, relayed.text, payload, vector, started)

    # ------------------------------------------------------------------ sync face
    def complete(
        self, kwargs: dict[str, Any], tenant: str = "anonymous", control: CacheControl | None = None
    ) -> Result:
        """`acomplete` for sync callers, run on this pipeline's own loop thread; a stream comes
        back as a sync iterator (closing or dropping it cancels the backend stream)."""
        result = self._sync.run(self.acomplete(kwargs, tenant, control))
        if result.stream is not None and not isinstance(result.stream, Replay):  # a Replay iterates as is
            result.stream = self._sync.iterate(result.stream)
        return result

    # ------------------------------------------------------------------ helpers
    def _served_hit(self, view: RequestView, hit: Hit, started: float) -> Result:
        info = CacheInfo(hit.tier, view.route.name, hit.similarity, hit.entry.id)
        self._remember(view, info)
        stored = hit.entry.response
        route = view.route.name
        self.metrics.requests.labels(route, hit.tier).inc()
        usage = stored.get("usage") or {}
        self.metrics.tokens_saved.labels(route).inc(int(usage.get("total_tokens") or 0))
        saved = stored.get("_kvgate_cost_usd")
        if saved:
            self.metrics.cost_saved.labels(route).inc(float(saved))
        self.metrics.latency.labels(route, hit.tier).observe(time.perf_counter() - started)
        if not view.stream:
            return Result(info, response=served_response(stored, info))
        include_usage = bool((view.forwarded.get("stream_options") or {}).get("include_usage"))
        # the replay is in memory: its first chunk goes out as soon as the lookup is done
        self.metrics.ttft.labels(route, hit.tier).observe(time.perf_counter() - started)
        return Result(info, stream=replayed(stored, info, include_usage))

    def _finish(self, view: RequestView, info: CacheInfo, entry: CacheEntry | None, started: float) -> None:
        route = view.route.name
        info.stored = entry is not None
        if entry is not None:
            info.entry_id = entry.id
        self._remember(view, info)
        self.metrics.requests.labels(route, "miss").inc()
        self.metrics.latency.labels(route, "miss").observe(time.perf_counter() - started)

    def _remember(self, view: RequestView, info: CacheInfo) -> None:
        """Log what this request id was served from / stored as, for feedback."""
        record = RequestRecord(view.tenant, view.route.name, info.cache, view.scope, info.entry_id, info.similarity)
        self.requests.record(info.request_id, record)

    def feedback(self, request_id: str, correct: bool, tenant: str = "anonymous") -> FeedbackOutcome:
        """Judge an earlier answer (see middleware/feedback.py); RequestNotFound if not this tenant's."""
        record = self.requests.get(request_id)
        route = next((r for r in self.config.routes if record is not None and r.name == record.route), None)
        mark_ttl = route.semantic.ttl if route is not None else None
        outcome = give_feedback(self.index, self.requests, self.metrics, request_id, correct, tenant, mark_ttl)
        verified = route is not None and self.trust is not None and self.semantic[route.name].max_error_rate is not None
        if verified and record is not None and record.tier == "semantic" and record.entry_id is not None \
                and record.similarity is not None:  # a verdict on a served hit: an observation like an exploration's
            self.trust.observe(route.name, record.entry_id, record.similarity, correct, mark_ttl)  # type: ignore[union-attr]
        return outcome

    def _count_lookup(self, view: RequestView, tier: str, started: float, hit: bool) -> None:
        route = view.route.name
        self.metrics.lookups.labels(route, tier).inc()
        self.metrics.lookup_latency.labels(route, tier).observe(time.perf_counter() - started)
        if hit:
            self.metrics.hits.labels(route, tier).inc()

    def watch_replica(self, route: str, name: str) -> None:
        """Export kvgate_replica_up for a replica added to `route`'s router while the proxy runs
        (middleware/admin.py), as __init__ does for the configured ones."""
        replica = next(r for r in self.routers[route].replicas if r.name == name)
        self.metrics.replica_up.labels(route, name).set_function(lambda r=replica: float(r.healthy))

    def forget_replica(self, route: str, name: str) -> None:
        """Stop exporting kvgate_replica_up for a replica removed from `route` (middleware/admin.py)."""
        self.metrics.replica_up.remove(route, name)




def _load_verifier(config: Config, position: int) -> Verifier:
    """The trained verifier; a missing one is a ConfigError naming the route that needs it."""
    try:
        return load_verifier(config.embedder.verifier_path)
    except VerifierMissing as exc:
        raise ConfigError(f"routes.{position}.semantic.verifier: {exc}") from None


def _make_embedder(config: Config) -> Embedder:
    """The configured embedder; mpnet without its wheels is a ConfigError naming the field."""
    from index.mpnet_files import MpnetMissing

    try:
        return make_embedder(config.embedder.backend, config.embedder.model_path, model=config.embedder.model)
    except MpnetMissing as exc:
        raise ConfigError(f"embedder.model: {exc}") from None


def expected_cached(call: Call) -> int | None:
    """The prefix the router expected the answering replica to hold (None without a router)."""
    ticket = call.ticket
    return None if ticket is None else ticket.plan.expected_cached_tokens(ticket.replica.name)


def _salter(config: Config) -> Salter | None:
    """The engines' cache-salt maker, when a tenant-scoped route forwards to replicas that may
    take one (routing.cache_salt); a missing secret variable is a ConfigError naming the field."""
    if not any(r.replicas and r.scope == "tenant" and r.routing.cache_salt and r.routing.engine != "openai"
               for r in config.routes):
        return None
    try:
        return Salter(load_secret(config.cache_dir, config.auth.salt_secret_env))
    except ValueError as exc:
        raise ConfigError(f"auth.salt_secret_env: {exc}") from None


def _router_for(route: RouteConfig, state: StateFactory | None, salter: Salter | None = None) -> Router | None:
    """The route's Router; `state` shares its load and decisions with other proxy processes."""
    if not route.replicas:
        return None
    shared = state(route.name, [r.name for r in route.replicas]) if state is not None else None
    return Router(route.replicas, route.routing, state=shared, defer_records=True,
                  salter=salter if route.scope == "tenant" else None, name=route.name)
