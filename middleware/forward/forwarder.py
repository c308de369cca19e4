"""One route's forwarding: a miss to a replica and back.

A Forwarder owns the transport (the relay for the proxy's misses on OpenAI-compatible replicas,
LiteLLM otherwise), asks the router once for the replica (kvgate.middleware.forward.failover books the
choice, failover and mid-stream resume), hands the complete answer to the response cache (an
`AnswerSink`) and then tells the router what the replica now holds.

Invariants: the router's ticket for a request is closed exactly once, also when the client goes
away mid-stream (the replica's books balance); an answer is stored before a streamed response's
end reaches the client.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Callable, Mapping

from kvgate.middleware.answers import answer_text, assemble, streamed_text, tag
from kvgate.middleware.config import Config, RouteConfig
from kvgate.middleware.errors import BackendError
from kvgate.middleware.forward.failover import Attempts, Failover
from kvgate.middleware.forward.litellm_call import Call, LiteLLMCall
from kvgate.middleware.forward.relay import DONE, Relay, Relayed, wire_model
from kvgate.middleware.outcome import AnswerSink, CacheInfo, Result
from kvgate.middleware.request import RequestView
from kvgate.middleware.routing.router import Router
from kvgate.middleware.telemetry.metrics import Metrics
from kvgate.middleware.text_answers import streamed_text_answer

ENGINE_PROBE_S = 3.0  # how long a route's first request waits to learn its replicas' engines


class Forwarder:
    def __init__(self, route: RouteConfig, router: Router | None, metrics: Metrics, relay: Relay) -> None:
        self.route = route
        self.router = router
        self.metrics = metrics
        self.relay = relay  # the proxy's pooled pass-through, shared by every route
        self.failover = Failover(route, router, metrics)
        self.litellm = LiteLLMCall(route, self.failover)

    def model_for(self, view: RequestView) -> str:
        """The LiteLLM model string a miss is sent as (also what its price is looked up by)."""
        return self.route.backend.model or view.model

    # ------------------------------------------------------ the cache step's hooks (RouteHashing)
    def new_chars(self, messages: list[dict[str, Any]]) -> int | None:
        """Prompt characters the route's prefix hashing has not seen (None: it hashes nothing)."""
        hasher = self.router.hasher if self.router is not None else None
        return hasher.uncached_chars(messages) if hasher is not None else None

    def prepare(self, view: RequestView) -> None:
        """Hash the prompt for the plan now (the caller is on a worker thread)."""
        if self.router is not None:
            self.router.prepare(view.routing_prompt, salt=self.failover.salt(view))

    # ------------------------------------------------------ a miss
    async def forward(self, view: RequestView, sink: AnswerSink, raw: bool = False) -> Result:
        """Send the miss, return its response (or stream); the answer reaches `sink` once complete.
        With `raw` (the proxy), a relayed route's answer comes back as the replica's bytes."""
        wire = self._wire(view) if raw else None
        if wire is not None:
            return await self._relayed(view, wire, sink)
        call = await self._counted(self.litellm.open(view, self.model_for(view)))
        info = sink.miss(call.attempts.replica, call.attempts.expected_cached_tokens())
        if view.stream:
            return Result(info, stream=self._tee(view, info, call, sink))
        payload = call.response.model_dump()
        answer = answer_text(payload)
        try:
            await sink.record(info, answer, lambda: payload, self._hash_answer(view, call.attempts, answer))
        finally:  # after the record step worked out the answer's routing hashes: recording them is cheap
            self.failover.done(call.attempts, True, view, answer)
        tag(call.response, info)
        return Result(info, response=call.response)

    def _wire(self, view: RequestView) -> str | None:
        """The wire model when this request can be relayed, else None (LiteLLM takes it)."""
        if self.route.routing.forward != "relay":
            return None
        # a completions request also takes the relay to a route's one OpenAI-compatible backend:
        # LiteLLM's text-completion stream rewrites the chunks, which a byte-exact replay cannot keep
        if self.router is None and not (view.completions and self.route.backend.api_base):
            return None
        return wire_model(self.model_for(view))

    def _hash_answer(self, view: RequestView, attempts: Attempts, answer: str | None) -> Callable[[], None] | None:
        """The routing hashes of prompt + answer, for the router's record of what the replica holds."""
        if self.router is None or attempts.ticket is None or answer is None:
            return None
        router, plan, conversation = self.router, attempts.ticket.plan, view.with_answer(answer)
        if conversation is None:
            return None
        return lambda: router.prepare_answer(plan, conversation)

    async def _counted(self, pending: Any) -> Any:
        try:
            call = await pending
        except BackendError:
            self.metrics.backend_calls.labels(self.route.name, "error").inc()
            raise
        self.metrics.backend_calls.labels(self.route.name, "ok").inc()
        return call

    async def _tee(self, view: RequestView, info: CacheInfo, call: Call, sink: AnswerSink) -> AsyncIterator[Any]:
        chunks: list[Any] = []
        ok = False
        try:
            # resumes on another replica mid-stream; closed with us when the client goes away
            async with contextlib.aclosing(self.litellm.stream(view, call)) as stream:
                async for chunk in stream:
                    if not chunks:
                        sink.first_token()
                    chunks.append(chunk)
                    yield chunk
            ok = True
        except Exception as exc:
            raise self.failover.error(exc) from exc
        finally:
            if not ok:  # the stream broke or the client went away: never stored
                self.failover.done(call.attempts, False, view)
        answer = streamed_text(chunks)
        try:  # LiteLLM may count prompt tokens while assembling: only when the request stores
            await sink.record(info, answer, lambda: streamed_text_answer(chunks) if view.completions
                              else assemble(chunks, view.messages),
                              self._hash_answer(view, call.attempts, answer))
        finally:  # also when the client leaves meanwhile: the replica's books must balance
            self.failover.done(call.attempts, True, view, answer)

    # ------------------------------------------------------ the relay
    async def _relayed(self, view: RequestView, wire: str, sink: AnswerSink) -> Result:
        relayed: Relayed = await self._counted(self.relay.open(self.failover, view, wire))
        attempts = relayed.attempts
        info = sink.miss(attempts.replica, attempts.expected_cached_tokens())
        if view.stream:  # its first event is in: the client's first bytes go out now
            sink.first_token()
            return Result(info, raw=self._relay_tee(view, info, relayed, sink))
        assert relayed.payload is not None
        payload = relayed.payload
        self._attribute(view, attempts, payload.get("usage"))
        answer = answer_text(payload)
        try:
            await sink.record(info, answer, lambda: payload, self._hash_answer(view, attempts, answer))
        finally:
            self.failover.done(attempts, True, view, answer)
        return Result(info, raw=relayed.body)

    async def _relay_tee(self, view: RequestView, info: CacheInfo, relayed: Relayed,
                         sink: AnswerSink) -> AsyncIterator[bytes]:
        """A relayed stream's bytes; the answer is stored before [DONE] reaches the client."""
        attempts = relayed.attempts
        try:
            async with contextlib.aclosing(self.relay.stream(self.failover, view, relayed)) as stream:
                async for blob in stream:
                    yield blob
        finally:
            if not relayed.ok:  # the stream broke or the client went away: never stored
                self.failover.done(attempts, False, view)
        if relayed.ok:
            self._attribute(view, attempts, relayed.parser.usage if relayed.parser is not None else None)
            answer = relayed.text
            try:  # may rebuild tool calls: only when the request stores
                await sink.record(info, answer, lambda: relayed.answer(view.messages),
                                  self._hash_answer(view, attempts, answer))
            finally:  # also when the client leaves meanwhile: the replica's books must balance
                self.failover.done(attempts, True, view, answer)
        yield DONE

    def _attribute(self, view: RequestView, attempts: Attempts, usage: Any) -> None:
        """Expected against reported cached tokens of a miss (kvgate_replica_*_cached_tokens)."""
        ticket = attempts.ticket
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


async def know_engines(config: Config, forwarders: Mapping[str, Forwarder], kwargs: dict[str, Any]) -> bool:
    """Before a route's first requests: ask its replicas what engine they run (salting and precise
    hashing depend on it); bounded, and a replica that does not answer is asked again by the health
    loop. True once every route's replicas have answered."""
    model = kwargs.get("model")
    route = (config.match(model, "chat") or config.match(model, "completions")) if isinstance(model, str) else None
    forwarder = forwarders.get(route.name) if route is not None else None
    router = forwarder.router if forwarder is not None else None
    if router is not None and not router.discovered:
        try:
            await asyncio.wait_for(router.discover(), ENGINE_PROBE_S)
        except (asyncio.TimeoutError, OSError):
            pass
    return all(f.router.discovered for f in forwarders.values() if f.router is not None)
