"""The OpenAI-compatible proxy: thin FastAPI handlers over the Pipeline.

Errors of every kind leave as OpenAI error JSON (`{"error": {...}}`): the exception handlers here
hand each one to the one mapper, middleware/server/responses.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvgate.middleware.build import build_pipeline
from kvgate.middleware.config import Config
from kvgate.middleware.errors import KvgateError, Unauthorized
from kvgate.middleware.forward.http_gets import PooledGets
from kvgate.middleware.pipeline import Pipeline
from kvgate.middleware.routing.router import Router
from kvgate.middleware.server.admin import add_admin, admin_check
from kvgate.middleware.server.admission import AdmissionGate
from kvgate.middleware.server.auth import KeyGate, bearer_text, key_allowed
from kvgate.middleware.server.body import ClientGone, parse_json, read_body
from kvgate.middleware.server.chat_asgi import CHAT_PATH, COMPLETIONS_PATH, ByPath, ChatHandler, Delegate, LeanApp
from kvgate.middleware.server.completions_asgi import CompletionsHandler
from kvgate.middleware.server.fleet_sync import FleetSync
from kvgate.middleware.server.governance import add_governance
from kvgate.middleware.server.heap import settle_heap
from kvgate.middleware.server.responses import error_response
from kvgate.middleware.server.schema import CompletionRequest, FeedbackRequest, chat_openapi_extra
from kvgate.middleware.server.ui import add_dashboard, make_recorder, record_stats
from kvgate.middleware.telemetry.loop_lag import watch_loop_lag
from kvgate.middleware.telemetry.metrics import Metrics
from kvgate.middleware.telemetry.replica_poll import ReplicaPoller, polled_routes

if TYPE_CHECKING:
    from kvgate.middleware.routing.state import StateFactory
    from kvgate.middleware.routing.state_workers import WorkerHub

log = logging.getLogger("kvgate.proxy")
T = TypeVar("T")
FRESH_WAIT_S = 2.0  # the longest a scrape of /metrics waits for the replicas' numbers (then shows what it has)


def tenant_of(token: str | None) -> str:
    """A tenant id derived from the bearer token; the token itself is never stored."""
    return hashlib.sha256(token.encode()).hexdigest()[:24] if token else "anonymous"


def create_app(
    config: Config,
    pipeline: Pipeline | None = None,
    *,
    routing_state: StateFactory | None = None,
    worker: int | None = None,
    server_process: bool = False,
    workers_hub: WorkerHub | None = None,
) -> FastAPI:
    """Build the app; the pipeline (embedder + index) is created at start-up unless given.
    `routing_state` and `worker`: this process is worker `worker` of `kvgate serve --workers N`
    (its responses say so in `x-kvgate-worker`, its /health in `worker`); `workers_hub`: that
    worker's end of what the workers share, whose replica lists the admin API changes
    (middleware/server/fleet_sync.py). `server_process`: the
    process is the server's own (`kvgate serve`), so its garbage collector is set for it
    (kvgate.middleware.server.heap) once the pipeline is up."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = pipeline is None
        app.state.pipeline = pipeline or build_pipeline(config, routing_state=routing_state)
        pipe = app.state.pipeline
        pipe.metrics.in_flight.set_function(lambda: admission.in_flight)
        if server_process:
            settle_heap()
        tasks = [asyncio.create_task(_probe_loop(r, r.cfg.probe_interval_s)) for r in pipe.routers.values()]
        tasks.append(
            asyncio.create_task(
                watch_loop_lag(
                    pipe.metrics.loop_lag.observe, activity=lambda: (admission.in_flight, admission.admitted)
                )
            )
        )
        # /health and /metrics read the disk (the index catches up with other processes): in a
        # thread of their own, so a probe never queues behind request work in the default pool
        app.state.probes = ThreadPoolExecutor(1, thread_name_prefix="kvgate-probes")
        # one reader of the replicas' /metrics for routing (prefill_time), the dashboard and /metrics
        app.state.replica_poller = poller = ReplicaPoller(
            pipe.routers, polled_routes(pipe.routers, config.stats.scrape_replicas)
        )
        tasks.append(asyncio.create_task(poller.run(app.state.probes, PooledGets)))
        pipe.metrics.watch_engines(poller.readings)
        app.state.stats = make_recorder(pipe, config.stats)  # the dashboard's history (middleware/server/ui.py)
        # a point takes the pages read since the one before (an engine's reads lag its interval a little)
        page_age = config.stats.interval_s + max((p.interval_s for p in poller.routes.values()), default=0.0)
        tasks.append(
            asyncio.create_task(
                record_stats(
                    app.state.stats,
                    pipe.metrics.registry,
                    lambda: poller.pages(page_age),
                    app.state.probes,
                    config.stats.interval_s,
                )
            )
        )
        if app.state.fleet_sync is not None:  # the replicas the other workers added or removed meanwhile
            await app.state.fleet_sync.start(pipe)
        yield
        if app.state.fleet_sync is not None:
            app.state.fleet_sync.stop()
        for task in tasks:
            task.cancel()
        await app.state.pipeline.aclose()
        app.state.probes.shutdown(wait=False, cancel_futures=True)
        if owned:
            app.state.pipeline.close()

    app = LeanApp(title="kvgate", version="0.1.0", lifespan=lifespan)
    app.state.fleet_sync = FleetSync(config, workers_hub) if workers_hub is not None else None
    keys = frozenset(config.auth.keys)
    # every route but /health, present and future; admin keys pass it on the admin paths only
    app.add_middleware(KeyGate, keys=keys, admin_keys=frozenset(config.auth.admin_keys))
    chat = ChatHandler(app, config, worker, tenant_of, parse_json)
    completions = CompletionsHandler(app, config, worker, tenant_of, lambda raw: parse_json(raw, CompletionRequest))
    lean = ByPath({CHAT_PATH: chat, COMPLETIONS_PATH: completions})
    # chat and text completions take the lean path (middleware/server/chat_asgi.py) through the same key
    # gate, and the admission gate inside it: a caller without a key is refused before it is counted
    admission = AdmissionGate(
        lean, limit=config.server.max_in_flight, on_reject=lambda: _metrics(app).rejected.labels("overloaded").inc()
    )
    app.lean = KeyGate(admission, keys=keys)

    key_bytes = frozenset(k.encode() for k in keys)

    def authorise(request: Request) -> str:
        token = bearer_text(request.scope)
        if keys and not key_allowed(token.encode() if token is not None else None, key_bytes):  # constant time
            raise Unauthorized("missing or unknown API key" if token is None else "invalid API key")
        return tenant_of(token)

    async def _error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    # every error leaves through the one mapper; the kinds it knows are named, so that Starlette
    # answers them in its exception layer (Exception's handler answers, then re-raises to the server)
    for kind in (KvgateError, RequestValidationError, ValidationError, StarletteHTTPException, ClientGone, Exception):
        app.add_exception_handler(kind, _error)

    @app.post("/v1/chat/completions", openapi_extra=chat_openapi_extra())
    async def chat_completions() -> Response:  # documents the route; the lean path serves it
        return Delegate(app.lean or chat)

    @app.post("/v1/completions", openapi_extra=chat_openapi_extra(CompletionRequest))
    async def text_completions() -> Response:  # documents the route; the lean path serves it
        return Delegate(app.lean or completions)

    @app.post(
        "/v1/cache/feedback",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": FeedbackRequest.model_json_schema()}},
            }
        },
    )
    async def cache_feedback(request: Request) -> dict[str, Any]:
        tenant = authorise(request)  # before reading the body: no key, no parsing
        raw = await read_body(request.scope, request.receive, config.server.max_body_bytes)
        body = FeedbackRequest.model_validate(await parse_json(raw, FeedbackRequest))
        outcome = await asyncio.to_thread(request.app.state.pipeline.feedback, body.request_id, body.correct, tenant)
        return outcome.to_json()

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorise(request)
        data = [{"id": r.model, "object": "model", "owned_by": f"kvgate:{r.name}"} for r in config.routes]
        return {"object": "list", "data": data}

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        pipe = request.app.state.pipeline
        entries = await _off_loop(request.app.state.probes, len, pipe.index)
        # semantic: whether an embedder runs (without one, every route is exact-only: the start log says why)
        if worker is None:
            return {"status": "ok", "entries": entries, "semantic": pipe.embedder is not None}
        return {"status": "ok", "entries": entries, "semantic": pipe.embedder is not None, "worker": worker}

    @app.get("/ready")
    async def ready(request: Request) -> JSONResponse:
        """Readiness (no auth, for a load balancer's probe): 200 once every route routes as
        configured, 503 with what each route still waits for (it answers meanwhile, by load)."""
        routers: dict[str, Router] = request.app.state.pipeline.routers
        waiting = {name: why for name, router in routers.items() if (why := router.readiness()) is not None}
        if waiting:
            return JSONResponse({"status": "starting", "waiting": waiting}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        authorise(request)
        await request.app.state.replica_poller.fresh(FRESH_WAIT_S)  # the engines' numbers, read if stale
        body = await _off_loop(request.app.state.probes, request.app.state.pipeline.metrics.render)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    add_dashboard(app)  # /ui and /v1/stats (middleware/server/ui.py)
    add_admin(app, config, worker)  # /v1/admin/...: replicas added and removed at run time (middleware/server/admin.py)
    add_governance(app, config, admin_check(config), tenant_of)  # erase a tenant, invalidate tags (governance.py)
    return app


async def _off_loop(pool: Executor, fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


def _metrics(app: FastAPI) -> Metrics:
    return app.state.pipeline.metrics


async def _probe_loop(router: Router, interval: float) -> None:
    """Learn what engine each replica runs (and its model revision, asked again every round);
    re-admit replicas marked down once they answer."""
    async with PooledGets() as client:  # httpx's interface, at the relay client's cost per GET
        while True:
            try:
                await router.recheck_engines(client)  # restarted with other weights: described anew below
                await router.discover(client)  # until every replica said what engine it runs
            except Exception:
                log.exception("engine discovery failed")
            await asyncio.sleep(interval)
            try:
                await router.probe(client)
            except Exception:  # a probe must never take the proxy down
                log.exception("health probe failed")
