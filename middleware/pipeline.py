"""The request pipeline: look a request up in the response cache, then serve the hit, or forward
the miss to its route's replicas and record the answer.

No HTTP here: the proxy and the SDK both call `acomplete` / `complete` with LiteLLM-style kwargs
and get back litellm response objects (or chunk iterators) plus a CacheInfo. The flow is written
once, async; `complete` is a thin sync adapter that runs it on the pipeline's own loop thread
(kvgate.middleware.sync_adapter). The cache (kvgate.middleware.cache) and the forwarding
(kvgate.middleware.forward) meet only here: the route is matched once, the view built once, one
step does the look-up and the forwarder's prepare, and the record step after the answer is the
pipeline's; the steps' bodies are kvgate.middleware.steps. The objects are built from config by
kvgate.middleware.build.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from kvgate.middleware.answers import Replay, tag
from kvgate.middleware.cache.feedback import FeedbackOutcome
from kvgate.middleware.cache.offload import INLINE_TOTAL_CHARS, prompt_chars, runs_inline
from kvgate.middleware.cache.response_cache import ResponseCache
from kvgate.middleware.config import Config, RouteConfig
from kvgate.middleware.forward.forwarder import Forwarder, know_engines
from kvgate.middleware.forward.relay import Relay
from kvgate.middleware.outcome import CacheInfo, Result  # noqa: F401  (public here too)
from kvgate.middleware.request import CacheControl, RequestView, match_route
from kvgate.middleware.routing.router import Router
from kvgate.middleware.steps import ending, look_up, recorded
from kvgate.middleware.sync_adapter import SyncAdapter
from kvgate.middleware.telemetry.metrics import Metrics

if TYPE_CHECKING:
    from kvgate.index.responses.embedder import Embedder
    from kvgate.index.responses.semantic import SemanticIndex
    from kvgate.index.responses.verifier import Verifier
    from kvgate.middleware.cache.governance import Governance
    from kvgate.middleware.cache.request_log import RequestLog
    from kvgate.middleware.cache.trust_gate import TrustGate
    from kvgate.middleware.cache.verification import SemanticSettings


class Pipeline:
    """Safe to share across requests; built by `kvgate.middleware.build.build_pipeline`."""

    def __init__(
        self,
        config: Config,
        cache: ResponseCache,
        forwarders: dict[str, Forwarder],
        relay: Relay,
        metrics: Metrics,
        closing: list[Any],
        governance: "Governance | None" = None,
    ) -> None:
        self.config = config
        self.governance = governance  # erasing tenants, invalidating tags (kvgate.middleware.cache.governance)
        self.cache = cache
        self.forwarders = forwarders
        self.relay = relay  # the proxy's pass-through to OpenAI-compatible replicas, shared by the routes
        self.metrics = metrics
        self._closing = closing  # what else the pipeline owns, closed in this order before the cache
        self._engines_known = False  # every route's replicas said what engine they run
        self._sync = SyncAdapter()  # the sync face's own loop, started by the first `complete`

    async def acomplete(
        self,
        kwargs: dict[str, Any],
        tenant: str = "anonymous",
        control: CacheControl | None = None,
        *,
        raw: bool = False,
        endpoint: str = "chat",
    ) -> Result:
        """With `raw` (the proxy), a miss on a relayed route comes back as the replica's bytes,
        a completions hit as its JSON body or SSE events. `endpoint` "completions": `kwargs` is
        one completions prompt (`prompt`, not `messages`)."""
        started = time.perf_counter()
        route = match_route(self.config, kwargs, endpoint)  # the one match: everything below takes it
        forwarder = self.forwarders[route.name]
        if not self._engines_known:  # the steady state: one read per request
            self._engines_known = await know_engines(self.forwarders, forwarder)
        inline = self._inline(route, kwargs, endpoint, forwarder)
        step = (self.cache, forwarder, route, kwargs, tenant, control, endpoint, started, inline, raw)
        looked = look_up(*step) if inline else await asyncio.to_thread(look_up, *step)
        if looked.result is not None:
            await self.cache.logged(looked)
            return looked.result
        back = time.perf_counter()  # on the loop again after the look-up (a worker thread's, or inline)
        forwarded = await forwarder.forward(looked.view, raw=raw)
        attempts = forwarded.attempts
        info = self.cache.miss(looked, attempts.replica, attempts.expected_cached_tokens())
        if forwarded.first_at and looked.spans is not None:  # relayed: the replica's send and first bytes
            info.timing = (started, *looked.spans, back, forwarded.sent_at, forwarded.first_at)
        else:  # forwarded through LiteLLM
            info.timing = (started,)
        if looked.view.stream:  # recorded once read to its end, before the end reaches the client
            stream = ending(self.cache, forwarder, looked, info, forwarded)
            return Result(info, raw=stream) if forwarded.raw else Result(info, stream=stream)
        await recorded(self.cache, forwarder, looked, info, forwarded)
        if forwarded.raw:
            return Result(info, raw=forwarded.reply)
        tag(forwarded.reply, info)
        return Result(info, response=forwarded.reply)

    def _inline(self, route: RouteConfig, kwargs: dict[str, Any], endpoint: str, forwarder: Forwarder) -> bool:
        """Whether this request's look-up and record steps run on the event loop rather than in a
        worker thread (kvgate.middleware.cache.offload); decided from the raw kwargs, before any
        of the prompt is digested."""
        limit = self.cache.inline_chars[route.name]
        if endpoint == "completions":  # a prompt is hashed whole: all of it is new
            prompt = kwargs.get("prompt")
            total = len(prompt) if isinstance(prompt, (str, list)) else -1
            return total < 0 or runs_inline(total, total, limit)
        messages = kwargs.get("messages")
        total = prompt_chars(messages)
        if total < 0:  # the view refuses it at once, wherever it runs
            return True
        if limit is None or total > INLINE_TOTAL_CHARS:  # decided before digesting a long prompt
            return False
        if total <= limit:  # its new part is no longer than the whole: inline, without asking the hasher
            return True
        new = forwarder.new_chars(messages)
        return runs_inline(total, total if new is None else new, limit)

    def complete(
        self,
        kwargs: dict[str, Any],
        tenant: str = "anonymous",
        control: CacheControl | None = None,
        endpoint: str = "chat",
    ) -> Result:
        """`acomplete` for sync callers, run on this pipeline's own loop thread; a stream comes
        back as a sync iterator (closing or dropping it cancels the backend stream)."""
        result = self._sync.run(self.acomplete(kwargs, tenant, control, endpoint=endpoint))
        if result.stream is not None and not isinstance(result.stream, Replay):  # a Replay iterates as is
            result.stream = self._sync.iterate(result.stream)
        return result

    def feedback(self, request_id: str, correct: bool, tenant: str = "anonymous") -> FeedbackOutcome:
        """Judge an earlier answer (middleware/cache/feedback.py); RequestNotFound if not this tenant's."""
        return self.cache.feedback(request_id, correct, tenant)

    def view(
        self,
        kwargs: dict[str, Any],
        tenant: str = "anonymous",
        control: CacheControl | None = None,
        endpoint: str = "chat",
    ) -> RequestView:
        return self.cache.view(match_route(self.config, kwargs, endpoint), kwargs, tenant, control, endpoint)

    def close(self) -> None:
        self._sync.close()  # first: open sync streams end (unstored) while the index is still open
        for part in self._closing:
            part.close()
        self.cache.close()

    async def aclose(self) -> None:
        """Release what lives on the serving loop (the relay's connection pool); before `close`."""
        await self.relay.aclose()

    # ------------------------------------------------------------------ what the faces read
    @property
    def routers(self) -> dict[str, Router]:
        return {name: f.router for name, f in self.forwarders.items() if f.router is not None}

    @property
    def index(self) -> "SemanticIndex":
        return self.cache.index

    @property
    def requests(self) -> "RequestLog":
        return self.cache.requests

    @property
    def embedder(self) -> "Embedder | None":
        return self.cache.semantic.embedder

    @property
    def verifier(self) -> "Verifier | None":
        return self.cache.semantic.verifier

    @property
    def trust(self) -> "TrustGate | None":
        return self.cache.semantic.trust

    @property
    def semantic(self) -> "dict[str, SemanticSettings]":
        return self.cache.semantic.settings
