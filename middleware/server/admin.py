"""The admin API: replicas added to and removed from a route while the proxy runs, so scaling an
engine fleet needs no proxy restart.

    GET    /v1/admin/replicas                → 200 {"routes": {ROUTE: [REPLICA, ...]}}
    POST   /v1/admin/replicas                → 201 {"route", "replica": REPLICA, "note"}
           body {"route", "name", "api_base", "events"?, "api_key"?, "capacity_blocks"?}
    DELETE /v1/admin/replicas/{route}/{name} → 200 {"route", "removed": NAME, "note"}
    REPLICA = {"name", "api_base", "events", "healthy"} (never its api_key)
Tenants and tags (erase, invalidate): middleware/server/governance.py, behind the same key check.

What it owns: the HTTP face only — the admin key check, the request bodies, which error each
refusal is. The work is the Router's (`add_replica` / `remove_replica`: prefix index, routing
state, KV-event subscriber) and the Pipeline's (`watch_replica` / `forget_replica`: the
kvgate_replica_up gauge). Errors are KvgateErrors, turned into OpenAI error JSON by the proxy's
one mapper (middleware/server/responses.py, through the proxy's exception handlers); a body is read
by the proxy's one reader (middleware/server/body.py: 413 past server.max_body_bytes) and validated
against ReplicaConfig (middleware/config.py), so a 400 names the field as the YAML's check would.

Auth: `Authorization: Bearer KEY` with KEY one of `auth.admin_keys`, compared in constant time
against every one (kvgate.middleware.server.auth.key_allowed). With no admin key configured every call is
403: the admin API is never open by default. With `auth.keys` set, the proxy's KeyGate lets an
admin key through on these paths (middleware/server/auth.py), so an admin key need not be a tenant key;
a tenant key passes that gate and is refused here (403).

Not persisted: a change lives in this process's memory only. A restart reads the YAML again, so
update routes[].replicas there too; every POST/DELETE reply says so in "note". Under
`kvgate serve --workers N` each worker routes with its own router and a call reaches one of them:
the change goes through the workers' shared replica lists (middleware/server/fleet_sync.py), so
every worker makes it (the one called before it answers, the others within about a second). An
app that says it is a worker but has no shared lists refuses changes (409). Proxies sharing a
Redis store each need the call themselves.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from fastapi import Depends, FastAPI, Request
from pydantic import Field, field_validator

from kvgate.middleware.config import Config, ReplicaConfig
from kvgate.middleware.errors import BadRequest, Conflict, Forbidden, NotFound, Unauthorized
from kvgate.middleware.routing.base import ReplicaState
from kvgate.middleware.routing.router import Router
from kvgate.middleware.server.auth import ADMIN_PREFIX, bearer_token, key_allowed
from kvgate.middleware.server.body import parse_json, read_body
from kvgate.middleware.server.fleet_sync import FleetSync

log = logging.getLogger("kvgate.admin")

NOTE = "in memory only: a restart reads the YAML config again, so make the same change to routes[].replicas there"
WORKERS = (
    "this proxy is one of several workers with no shared replica lists, so a change here would reach "
    "this worker only; `kvgate serve --workers N` shares them (make the change there), or change "
    "routes[].replicas in the YAML and restart"
)


class AddReplica(ReplicaConfig):
    """POST body: a ReplicaConfig (its fields, limits and unknown-field refusal) and its route."""

    route: str = Field(min_length=1)

    @field_validator("api_base")
    @classmethod
    def _http(cls, api_base: str) -> str:
        # traffic goes there as soon as the call returns: a typo should be refused, not marked down later
        if not api_base.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return api_base


def admin_check(config: Config) -> Callable[[Request], None]:
    """The dependency every admin-only route takes: 403 with no admin key configured, 401 with
    no key sent, 403 for any other key (constant time against each admin key)."""
    admin_keys = frozenset(k.encode() for k in config.auth.admin_keys)

    def require_admin(request: Request) -> None:
        if not admin_keys:
            raise Forbidden("the admin API is off: set auth.admin_keys in the config to use it")
        token = bearer_token(request.scope.get("headers") or [])
        if token is None:
            raise Unauthorized("missing admin key: send Authorization: Bearer <one of auth.admin_keys>")
        if not key_allowed(token, admin_keys):
            raise Forbidden("not an admin key (auth.admin_keys)")

    return require_admin


def add_admin(app: FastAPI, config: Config, worker: int | None = None) -> None:
    """Register the admin API on `app` (the proxy's create_app calls this once); `worker`: the
    app is one worker of `kvgate serve --workers N`, whose changes go through
    `app.state.fleet_sync` (refused without one, see the docstring)."""
    require_admin = admin_check(config)
    known_routes = {r.name for r in config.routes}
    # the router keeps no events endpoint per replica: remembered here for the replies
    events: dict[tuple[str, str], str | None] = {(r.name, x.name): x.events for r in config.routes for x in r.replicas}

    def router_of(request: Request, route: str) -> Router:
        if route not in known_routes:
            raise NotFound(f"no route named {route!r}", param="route")
        router = request.app.state.pipeline.routers.get(route)
        if router is None:
            raise BadRequest(
                f"route {route!r} has no replicas (it calls its backend directly); replicas can "
                "be added only to a route configured with replicas and routing",
                param="route",
            )
        return router

    def view(route: str, replica: ReplicaState, sync: FleetSync | None = None) -> dict[str, Any]:
        key = (route, replica.name)  # a replica another worker added: its endpoint is the shared lists'
        return {
            "name": replica.name,
            "api_base": replica.api_base,
            "events": events[key] if key in events or sync is None else sync.events.get(key),
            "healthy": replica.healthy,
        }

    def shared(request: Request) -> FleetSync | None:
        """The workers' shared replica lists (None: one process); a worker without them refuses."""
        sync: FleetSync | None = getattr(request.app.state, "fleet_sync", None)
        if worker is not None and sync is None:
            raise Conflict(WORKERS)
        return sync

    # on the app itself, as the dashboard's routes are (an included router would hide them from
    # app.routes, which tests/test_isolation_auth.py walks); each route takes `admin`
    admin: dict[str, Any] = {"tags": ["admin"], "dependencies": [Depends(require_admin)]}
    replicas_path = f"{ADMIN_PREFIX}replicas"

    @app.get(replicas_path, **admin)
    async def list_replicas(request: Request) -> dict[str, Any]:
        routers: dict[str, Router] = request.app.state.pipeline.routers
        sync = getattr(request.app.state, "fleet_sync", None)
        return {"routes": {name: [view(name, r, sync) for r in router.replicas] for name, router in routers.items()}}

    @app.post(replicas_path, status_code=201, **admin)
    async def add_replica(request: Request) -> dict[str, Any]:
        sync = shared(request)
        # after the key check: no key, no reading; a 400 names the field, as the YAML's check would
        raw = await read_body(request.scope, request.receive, config.server.max_body_bytes)
        body = AddReplica.model_validate(await parse_json(raw, AddReplica))
        router = router_of(request, body.route)
        cfg = ReplicaConfig.model_validate(body.model_dump(exclude={"route"}))
        if any(r.name == cfg.name for r in router.replicas):
            raise Conflict(f"route {body.route!r} has a replica named {cfg.name!r} already", param="name")
        if router.cfg.prefix.mode == "precise" and not cfg.events:
            raise BadRequest(
                "invalid request: events: routing.prefix.mode precise needs the replica's KV-event endpoint (a ZMQ address)",
                param="events",
            )
        try:  # in a thread: precise mode waits for the new KV-event subscriber's socket
            if sync is not None:  # every worker's routers, this one's first (it counts the replica too)
                replica = await sync.add(body.route, cfg)
            else:
                replica = await asyncio.to_thread(router.add_replica, cfg)
                request.app.state.pipeline.metrics.watch_replica(body.route, replica)
        except ValueError as exc:  # a concurrent add of the name, a routing state that cannot take it,
            raise Conflict(str(exc), param="name") from None  # or no room left in the shared lists
        events[(body.route, cfg.name)] = cfg.events
        log.info("admin: replica %s (%s) added to route %s", cfg.name, cfg.api_base, body.route)
        return {"route": body.route, "replica": view(body.route, replica), "note": NOTE}

    @app.delete(replicas_path + "/{route}/{name}", **admin)
    async def remove_replica(request: Request, route: str, name: str) -> dict[str, Any]:
        sync = shared(request)
        router = router_of(request, route)
        if not any(r.name == name for r in router.replicas):
            raise NotFound(f"route {route!r} has no replica named {name!r}", param="name")
        if len(router.replicas) == 1:
            raise Conflict(f"{name!r} is the last replica of route {route!r}; add another one first", param="name")
        try:  # in a thread: stopping a KV-event subscriber joins its thread
            if sync is not None:
                await sync.remove(route, name)
            else:
                await asyncio.to_thread(router.remove_replica, name)
                request.app.state.pipeline.metrics.forget_replica(route, name)
        except KeyError:  # removed meanwhile by a concurrent call
            raise NotFound(f"route {route!r} has no replica named {name!r}", param="name") from None
        except ValueError as exc:  # the last one, after a concurrent removal
            raise Conflict(str(exc), param="name") from None
        events.pop((route, name), None)
        log.info("admin: replica %s removed from route %s", name, route)
        return {"route": route, "removed": name, "note": NOTE}
