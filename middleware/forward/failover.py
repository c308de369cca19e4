"""Failover across a route's replicas, shared by both transports (LiteLLM and the relay).

Rule: a connection error, timeout, 408/429 or 5xx marks the replica down (circuit open for
`routing.down_for_s`, then half-open; a 429 is load, not a fault, so it does not open the circuit)
and the request moves to the next best replica, up to `routing.max_attempts` replicas. A 4xx is
the caller's problem and is returned as is. Streams fail over before their first chunk; a stream
that breaks after it is re-issued on another replica and resumed where the client is
(kvgate.middleware.forward.resume) when the request is greedy, else it ends with an in-band error.

Failover drives the attempts: a transport hands it one attempt (`send`: the call on one replica's
arguments) and `answer` / `resume` choose the replicas, book each failure and try the next.

Invariant: every ticket the router hands out (`Router.started`) is closed exactly once
(`Router.finished`), by a failure booked here or by `done`; `Attempts.ticket` is the open one, or None.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TypeVar

from kvgate.middleware.config import RouteConfig
from kvgate.middleware.errors import BackendError, BadRequest
from kvgate.middleware.forward.resume import StreamResume, resumable
from kvgate.middleware.request import RequestView
from kvgate.middleware.routing.pending_answers import AnswerNote
from kvgate.middleware.routing.router import RoutePlan, Router, Ticket
from kvgate.middleware.telemetry.metrics import Metrics

log = logging.getLogger("kvgate.forward")
T = TypeVar("T")


@dataclass
class Attempts:
    """One request's way through its route's replicas."""

    plan: RoutePlan | None  # the router's plan (None: a route with one backend and no router)
    base: dict[str, Any]  # the call's arguments, the same on every replica
    tried: set[str] = field(default_factory=set)
    ticket: Ticket | None = None  # the replica answering now; None before an attempt and after a failure
    retries: int = 0  # a route's one backend asked again after a retryable failure (a transport without its own)

    @property
    def replica(self) -> str | None:
        return self.ticket.replica.name if self.ticket is not None else None

    def expected_cached_tokens(self) -> int | None:
        """The prefix the router expected the answering replica to hold (None without a router)."""
        ticket = self.ticket
        return None if ticket is None else ticket.plan.expected_cached_tokens(ticket.replica.name)


def status_of(exc: Exception) -> int | None:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def retryable(exc: Exception) -> bool:
    """Connection errors (no HTTP status), timeouts (LiteLLM's Timeout says 408), 429 and 5xx may
    succeed elsewhere."""
    status = status_of(exc)
    return status is None or status in (408, 429) or status >= 500


def error_message(exc: Exception) -> str:
    return getattr(exc, "message", None) or str(exc) or type(exc).__name__


class Failover:
    """A route's replica choice and failover bookkeeping (the router decides, this books)."""

    def __init__(self, route: RouteConfig, router: Router | None, metrics: Metrics | None = None) -> None:
        self.route = route
        self.router = router
        self.metrics = metrics

    def salt(self, view: RequestView) -> str | None:
        """The engine's cache_salt for this request (kvgate.middleware.routing.salt), or None."""
        if self.router is None:
            return None
        return self.router.salt(view.tenant if self.route.scope == "tenant" else None, view.params.get("cache_salt"))

    def begin(self, view: RequestView, base: dict[str, Any], retries: int = 0) -> Attempts:
        """The request's plan; no replica is chosen yet (`next` does). `retries`: how often a
        route's one backend (no router) is asked again after a retryable failure, for a
        transport that does not retry by itself (LiteLLM does, inside its call)."""
        if self.router is None:
            return Attempts(None, base, retries=retries)
        user = view.forwarded.get("user")
        plan = self.router.plan(
            view.routing_prompt, session=user if isinstance(user, str) else None, salt=self.salt(view)
        )
        self._check_context(view, plan)
        return Attempts(plan, base)

    def _check_context(self, view: RequestView, plan: RoutePlan) -> None:
        """Refuse, before any replica sees it, what the engine itself would refuse (400): a token
        id outside its vocabulary, a prompt longer than its context. Only in precise mode: there
        the tokenizer and the token count are the engine's own."""
        router = self.router
        if router is None or router.cfg.prefix.mode != "precise":
            return
        ids = view.prompt.token_ids if view.prompt is not None else None
        vocab = router.hasher.tokenizer.vocab_size if router.hasher is not None else None
        if ids and vocab is not None and max(ids) >= vocab:
            bad = next(i for i, t in enumerate(ids) if t >= vocab)
            raise BadRequest(
                f"token id {ids[bad]} is out of vocabulary (the model's vocabulary has {vocab} tokens)",
                param=f"prompt[{bad}]",
            )
        limit = router.context_limit
        if limit is None or plan.prompt_tokens <= limit or "truncate_prompt_tokens" in view.params:
            return
        raise BadRequest(
            f"This model's maximum context length is {limit} tokens. However, your prompt contains "
            f"{plan.prompt_tokens} input tokens. Please reduce the length of the input prompt.",
            param="prompt" if view.completions else "messages",
        )

    async def answer(self, attempts: Attempts, send: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`send(*args, call)` with the arguments (`call`) of the best replica not tried, then the
        next, until one answers; what it returned. Raises BackendError when none does."""
        while True:
            call = self._next(attempts)
            try:
                return await send(*args, call)
            except Exception as exc:  # connection errors, timeouts, error statuses, bad bodies
                if not self._failed(attempts, exc):
                    raise self.error(exc) from exc

    async def resume(
        self,
        view: RequestView,
        attempts: Attempts,
        resume: StreamResume,
        exc: Exception,
        send: Callable[..., Awaitable[T]],
        *args: Any,
    ) -> T:
        """A stream broke mid-way (`exc`): book it and `send(*args, call)` on the next replica,
        whose stream the caller resumes after what the client has; a re-issue that fails at once is
        booked as the next break. Re-raises when the stream cannot go on."""
        while True:
            call = self._resume_or_raise(view, attempts, resume, exc)
            try:
                return await send(*args, call)
            except Exception as again:
                exc = again

    def _next(self, attempts: Attempts) -> dict[str, Any]:
        """The arguments for the best replica not tried yet; its ticket becomes `attempts.ticket`.
        Raises BackendError when none is left."""
        if self.router is None or attempts.plan is None:
            return attempts.base
        replica = self.router.choose(attempts.plan, attempts.tried)
        if replica is None:
            raise BackendError(f"no replica left to try on route {self.route.name!r}")
        attempts.tried.add(replica.name)
        attempts.ticket = self.router.started(replica, attempts.plan)
        call = {**attempts.base, "api_base": replica.api_base}
        if replica.api_key:
            call["api_key"] = replica.api_key
        call.setdefault("api_key", "none")  # openai-compatible servers behind us may need none
        return call

    def _failed(self, attempts: Attempts, exc: Exception, when: str = "before_first_byte") -> bool:
        """Book the open attempt's failure; True when another replica should be tried."""
        ticket, attempts.ticket = attempts.ticket, None
        if self.router is None and attempts.retries > 0 and retryable(exc) and when == "before_first_byte":
            attempts.retries -= 1
            log.info("route %s: asking its backend again after %s", self.route.name, error_message(exc))
            return True
        if ticket is None or self.router is None:
            return False
        self.router.finished(ticket, ok=False)
        if not retryable(exc):
            return False
        if status_of(exc) != 429:
            self.router.mark_down(ticket.replica, error_message(exc))
        more = len(attempts.tried) < min(self.route.routing.max_attempts, len(self.router.replicas))
        if more:
            log.info("route %s: retrying on another replica after %s failed", self.route.name, ticket.replica.name)
            if self.metrics is not None:
                self.metrics.failovers.labels(self.route.name, when).inc()
        return more

    def _resume_or_raise(
        self, view: RequestView, attempts: Attempts, resume: StreamResume, exc: Exception
    ) -> dict[str, Any]:
        """A stream broke mid-way: book it and return the arguments for the next replica (whose
        stream the caller resumes after what the client has), or re-raise when it cannot go on."""
        if attempts.ticket is None or not resume.spliceable or not resumable(view.params):
            raise exc
        if not self._failed(attempts, exc, "mid_stream"):
            raise exc
        resume.restart()
        log.info(
            "route %s: stream broke after %d characters; resuming on another replica",
            self.route.name,
            len(resume.sent_text),
        )
        call = self._next(attempts)
        self.first_token(attempts)  # its prefill is no longer queued work we wait on
        return call

    def first_token(self, attempts: Attempts) -> None:
        if attempts.ticket is not None and self.router is not None:
            self.router.first_token(attempts.ticket)

    def done(self, attempts: Attempts, ok: bool, hashes: list[int] | AnswerNote | None = None) -> None:
        """The answer is complete (or abandoned); tell the router what the replica now holds
        (`hashes`: prompt + answer's, or a note of them, from `Router.answer_hashes`)."""
        ticket, attempts.ticket = attempts.ticket, None
        if ticket is None or self.router is None:
            return
        self.router.finished(ticket, ok, hashes if ok else None)

    def error(self, exc: Exception) -> BackendError:
        message = error_message(exc)
        log.warning("backend for route %s failed: %s", self.route.name, message)
        return BackendError(f"backend error on route {self.route.name!r}: {message}", backend_status=status_of(exc))
