"""One route's forwarding: a miss to a replica and back.

A Forwarder owns the transport (the relay for the proxy's misses on OpenAI-compatible replicas,
LiteLLM otherwise) and the route's failover (kvgate.middleware.forward.failover: it asks the router
for the replica, books the choice, fails over and resumes mid-stream). Only the pipeline calls it,
and nothing here calls back: `prepare` on the look-up hop (the prompt hashed and matched for the
plan), `forward` (the answer, or a stream that has it once it ends: a `Forwarded`), `hash_answer`
on the record step (prompt + answer hashed for the router's record), then `done`.

Invariant: the router's ticket for a request is closed exactly once (`done`, or a failure the
failover booked), also when the client goes away mid-stream (the replica's books balance).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Mapping

from kvgate.middleware.config import RouteConfig
from kvgate.middleware.errors import BackendError
from kvgate.middleware.forward.failover import Failover
from kvgate.middleware.forward.forwarded import Forwarded
from kvgate.middleware.forward.http_gets import PooledGets
from kvgate.middleware.forward.litellm_call import Call, LiteLLMCall
from kvgate.middleware.forward.relay import Relay, Relayed, wire_model
from kvgate.middleware.request import RequestView
from kvgate.middleware.routing.router import Router
from kvgate.middleware.telemetry.metrics import Metrics

ENGINE_PROBE_S = 3.0  # how long a route's first request waits to learn its replicas' engines
ENGINE_ASK_EVERY_S = 5.0  # requests ask a replica that did not describe itself at most this often
ENGINE_ASK_TIMEOUT_S = 2.0  # each of those questions
# their client: the relay pool's, with no TLS set-up unless a replica speaks https
_GETS = functools.partial(PooledGets, ENGINE_ASK_TIMEOUT_S)


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

    # ------------------------------------------------------ the look-up hop
    def new_chars(self, messages: list[dict[str, Any]]) -> int | None:
        """Prompt characters the route's prefix hashing has not seen (None: it hashes nothing)."""
        hasher = self.router.hasher if self.router is not None else None
        return hasher.uncached_chars(messages) if hasher is not None else None

    def prepare(self, view: RequestView) -> None:
        """Hash and match the prompt for the plan now (the caller is on a worker thread)."""
        if self.router is not None:
            self.router.prepare(view.routing_prompt, salt=self.failover.salt(view))

    # ------------------------------------------------------ a miss
    async def forward(self, view: RequestView, raw: bool = False) -> Forwarded:
        """Send the miss: its answer, or a stream that has it once read to its end. With `raw`
        (the proxy), a relayed route's answer is the replica's own bytes. Raises BackendError
        when no replica answers."""
        wire = self._wire(view) if raw else None
        try:
            forwarded = await (self._relayed(view, wire) if wire is not None else self._called(view))
        except BackendError:
            self.metrics.backend_calls.labels(self.route.name, "error").inc()
            raise
        self.metrics.backend_calls.labels(self.route.name, "ok").inc()
        return forwarded

    def _wire(self, view: RequestView) -> str | None:
        """The wire model when this request can be relayed, else None (LiteLLM takes it)."""
        if self.route.routing.forward != "relay":
            return None
        # a route's one backend is relayed when it names its server (`api_base`): without one,
        # LiteLLM knows where the provider lives and which environment variable holds its key
        if self.router is None and not self.route.backend.api_base:
            return None
        return wire_model(self.model_for(view))

    async def _relayed(self, view: RequestView, wire: str) -> Relayed:
        backend = self.route.backend
        routed = self.router is not None
        attempts = self.failover.begin(view, self.relay.base(backend, routed), 0 if routed else backend.num_retries)
        salt = attempts.plan.salt if attempts.plan is not None else None
        request = self.relay.request(view, wire, salt, backend.timeout)
        relayed = await self.failover.answer(attempts, self.relay.open, view, attempts, request)
        if view.stream:  # its first events are in: the client's first bytes go out as it is read
            relayed.reply = self.relay.stream(self.failover, relayed)
        return relayed

    async def _called(self, view: RequestView) -> Call:
        attempts = self.failover.begin(view, self.litellm.kwargs(view, self.model_for(view)))
        call = await self.failover.answer(attempts, self.litellm.send, view, attempts)
        if view.stream:
            self.failover.first_token(attempts)
            call.reply = self.litellm.stream(call)
        return call

    # ------------------------------------------------------ the record step, then done
    def hash_answer(self, forwarded: Forwarded, answer: str | None) -> None:
        """prompt + answer's routing hashes (`forwarded.hashes`), for the router's record of what
        the replica now holds; on the record step's thread, so the loop only hands them on."""
        ticket = forwarded.attempts.ticket
        if self.router is None or ticket is None or answer is None:
            return
        conversation = forwarded.view.with_answer(answer)  # the one place prompt + answer is built
        if conversation is not None:
            forwarded.hashes = self.router.answer_hashes(ticket.plan, conversation)

    def done(self, forwarded: Forwarded, ok: bool) -> None:
        """The answer was recorded (`ok`) or abandoned (the stream broke, the client left): close
        the ticket, telling the router what the replica now holds."""
        if ok:
            self._attribute(forwarded)
        self.failover.done(forwarded.attempts, ok, forwarded.hashes)

    def _attribute(self, forwarded: Forwarded) -> None:
        """Expected against reported cached tokens of a miss (kvgate_replica_*_cached_tokens)."""
        ticket, usage = forwarded.attempts.ticket, forwarded.usage
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        reported = details.get("cached_tokens") if isinstance(details, dict) else None
        if ticket is None or not isinstance(reported, int):
            return
        route, name = self.route.name, ticket.replica.name
        expected = ticket.plan.expected_cached_tokens(name)
        self.metrics.expected_cached.labels(route, name).inc(expected)
        self.metrics.reported_cached.labels(route, name).inc(reported)
        if abs(reported - expected) >= max(1, ticket.plan.block_size):
            self.metrics.cache_surprises.labels(route, name, "more" if reported > expected else "less").inc()


async def know_engines(forwarders: Mapping[str, Forwarder], forwarder: Forwarder) -> bool:
    """Before a route's first requests: ask its replicas what engine they run (salting and precise
    hashing depend on it), bounded. A replica that does not answer is asked again by the health
    loop, and in the background at most once per ENGINE_ASK_EVERY_S by requests (the SDK has no
    health loop), which do not wait for it. True once every route's replicas have answered."""
    router = forwarder.router
    if router is not None and not router.discovered and not router.know_engines_soon(ENGINE_ASK_EVERY_S, _GETS):
        async with _GETS() as client:
            try:
                await asyncio.wait_for(router.discover(client, not_within=ENGINE_ASK_EVERY_S), ENGINE_PROBE_S)
            except (asyncio.TimeoutError, OSError):
                pass
    return all(f.router.discovered for f in forwarders.values() if f.router is not None)
