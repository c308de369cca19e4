"""Prefix-aware routing for `litellm.Router` users: a CustomLogger that narrows a model group's
healthy deployments to the one kvgate's policy picks.

    plugin = PrefixRoutingPlugin(RoutingConfig(policy="cache_aware", prefix=PrefixConfig(tokenizer="smollm2")))
    litellm.callbacks = [plugin]
    router = litellm.Router(model_list=[...])   # deployments of one model_name = replicas

LiteLLM calls `async_filter_deployments` before it picks a deployment (async Router calls only);
we return a one-element list, so the Router's own strategy has nothing left to choose. Success and
failure events close the in-flight accounting and, in approximate mode, record prompt + answer
blocks on the deployment that served them. Deployments are identified by `model_info.id`.
"""

from __future__ import annotations

import threading
from typing import Any

from kvgate.middleware.litellm_env import litellm  # noqa: F401  (before any import from litellm)

# isort: split

from litellm.integrations.custom_logger import CustomLogger

from kvgate.middleware.config import ReplicaConfig, RoutingConfig
from kvgate.middleware.routing.router import Router, Ticket


def deployment_id(deployment: dict[str, Any]) -> str:
    info = deployment.get("model_info") or {}
    params = deployment.get("litellm_params") or {}
    return str(info.get("id") or params.get("api_base") or params.get("model"))


def _call_id(kwargs: dict[str, Any]) -> str | None:
    """The request's trace id: the one id LiteLLM passes both to the filter and to the loggers."""
    params = kwargs.get("litellm_params") or {}
    return kwargs.get("litellm_trace_id") or params.get("litellm_trace_id")


class PrefixRoutingPlugin(CustomLogger):
    def __init__(self, cfg: RoutingConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or RoutingConfig()
        self._routers: dict[str, Router] = {}
        self._tickets: dict[str, tuple[Router, Ticket, list[dict[str, Any]]]] = {}
        self._lock = threading.Lock()
        self.decisions = 0

    def router_for(self, model: str, deployments: list[dict[str, Any]]) -> Router:
        """One kvgate Router per model group, grown as deployments appear."""
        with self._lock:
            router = self._routers.get(model)
            known = {r.name for r in router.replicas} if router else set()
            new = [d for d in deployments if deployment_id(d) not in known]
            if router is None or new:
                replicas = [
                    ReplicaConfig(name=r.name, api_base=r.api_base) for r in (router.replicas if router else [])
                ]
                replicas += [
                    ReplicaConfig(
                        name=deployment_id(d), api_base=str((d.get("litellm_params") or {}).get("api_base") or "-")
                    )
                    for d in new
                ]
                fresh = Router(
                    replicas, self.cfg, hasher=router.hasher if router else None, index=router.index if router else None
                )
                if router is not None:  # keep live counters of known replicas
                    for old, kept in zip(router.replicas, fresh.replicas):
                        fresh.replicas[fresh.replicas.index(kept)] = old
                router = self._routers[model] = fresh
            return router

    async def async_filter_deployments(
        self,
        model: str,
        healthy_deployments: list,
        messages: list | None,
        request_kwargs: dict | None = None,
        parent_otel_span: Any = None,
    ) -> list[dict]:
        if not messages or len(healthy_deployments) < 2:
            return healthy_deployments
        router = self.router_for(model, healthy_deployments)
        healthy = {deployment_id(d) for d in healthy_deployments}
        user = (request_kwargs or {}).get("user")
        plan = router.plan(list(messages), session=user if isinstance(user, str) else None)
        self._close_continued(list(messages))
        replica = router.choose(plan, exclude={r.name for r in router.replicas if r.name not in healthy})
        if replica is None:
            return healthy_deployments
        ticket = router.started(replica, plan)
        call_id = _call_id(request_kwargs or {})
        if call_id:
            with self._lock:
                self._tickets[call_id] = (router, ticket, list(messages))
        self.decisions += 1
        return [d for d in healthy_deployments if deployment_id(d) == replica.name]

    def _close_continued(self, messages: list[dict[str, Any]]) -> None:
        """A request that continues an open call's conversation proves that call answered:
        LiteLLM reports success from a background task, often after the client's next turn has
        started, and a still-open ticket would count as load on the very replica we want."""
        with self._lock:
            done = [
                key
                for key, (_, _, prior) in self._tickets.items()
                if len(messages) > len(prior)
                and messages[: len(prior)] == prior
                and messages[len(prior)].get("role") == "assistant"
            ]
            entries = [self._tickets.pop(key) for key in done]
        for router, ticket, prior in entries:
            router.finished(ticket, True, router.answer_hashes(ticket.plan, messages[: len(prior) + 1]))

    def _close(self, kwargs: dict[str, Any], ok: bool, response: Any = None) -> None:
        call_id = _call_id(kwargs)
        with self._lock:
            entry = self._tickets.pop(call_id, None) if call_id else None
        if entry is None:
            return
        router, ticket, messages = entry
        answer = None
        if ok and response is not None:
            try:
                answer = response.choices[0].message.content
            except (AttributeError, IndexError):
                answer = None
        conversation = [*messages, {"role": "assistant", "content": answer}] if answer else None
        router.finished(ticket, ok, router.answer_hashes(ticket.plan, conversation) if conversation else None)

    async def async_log_success_event(self, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._close(kwargs, True, response_obj)

    async def async_log_failure_event(self, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._close(kwargs, False)
