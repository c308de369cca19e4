"""One worker's side of the replica lists shared under `kvgate serve --workers N`
(kvgate.middleware.routing.fleet_workers): the admin API's changes are written there, and every
worker brings its routers to what the lists say.

`add` and `remove` (the admin API, in the worker that took the call) change the shared lists, bring
this worker's routers in line and nudge the others before they return; `wake` (the hub's thread,
on a nudge or a changed file) schedules the same `apply` on this worker's loop; `apply` also runs
once at start-up, so a worker started again routes to what the others do. Applying is idempotent
and one at a time: it compares each router's replicas with the lists and adds or removes the
difference (Router.add_replica / remove_replica, and the Pipeline's replica gauges).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from kvgate.middleware.config import Config, ReplicaConfig
from kvgate.middleware.routing.state_workers import WorkerHub

if TYPE_CHECKING:
    from kvgate.middleware.pipeline import Pipeline
    from kvgate.middleware.routing.base import ReplicaState
    from kvgate.middleware.routing.router import Router

log = logging.getLogger("kvgate.admin")


class FleetSync:
    def __init__(self, config: Config, hub: WorkerHub) -> None:
        self.config, self.hub = config, hub
        self._configured = {r.name: list(r.replicas) for r in config.routes}
        self._pipeline: Pipeline | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self.events: dict[tuple[str, str], str | None] = {}  # KV-event endpoints of the replicas added here

    async def start(self, pipeline: "Pipeline") -> None:
        """On the serving loop, once the pipeline is up: apply the lists, then follow them."""
        self._pipeline, self._loop, self._lock = pipeline, asyncio.get_running_loop(), asyncio.Lock()
        await self.apply()
        self.hub.on_fleet = self.wake

    def stop(self) -> None:
        self.hub.on_fleet = None

    def wake(self) -> None:
        """The lists changed (any thread): apply them on the loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(lambda: loop.create_task(self._apply_logged()))

    async def add(self, route: str, cfg: ReplicaConfig) -> "ReplicaState":
        """The admin API's add: FleetConflict (the name is there, no room left) or the replica."""
        await asyncio.to_thread(self.hub.fleet.add, route, cfg, self._configured[route])
        await self.apply()
        self.hub.nudge_fleet()
        return next(r for r in self._router(route).replicas if r.name == cfg.name)

    async def remove(self, route: str, name: str) -> None:
        """The admin API's remove: KeyError (not on the route) or FleetConflict (its last one)."""
        await asyncio.to_thread(self.hub.fleet.remove, route, name, self._configured[route])
        await self.apply()
        self.hub.nudge_fleet()

    async def apply(self) -> None:
        """Bring every router to the shared lists (one apply at a time)."""
        assert self._lock is not None and self._pipeline is not None, "start() first"
        async with self._lock:
            for route, router in self._pipeline.routers.items():
                wanted = await asyncio.to_thread(self.hub.fleet.replicas, route, self._configured.get(route, []))
                names = {r.name for r in wanted}
                current = {r.name for r in router.replicas}
                for cfg in wanted:
                    if cfg.name not in current:
                        replica = await asyncio.to_thread(router.add_replica, cfg)
                        self.events[(route, cfg.name)] = cfg.events
                        self._pipeline.metrics.watch_replica(route, replica)
                        log.info("replica %s (%s) added to route %s (shared lists)", cfg.name, cfg.api_base, route)
                for name in current - names:
                    await asyncio.to_thread(router.remove_replica, name)
                    self._pipeline.metrics.forget_replica(route, name)
                    log.info("replica %s removed from route %s (shared lists)", name, route)

    async def _apply_logged(self) -> None:
        try:
            await self.apply()
        except Exception:  # a change this worker cannot make must not stop the others it follows
            log.exception("worker %d: applying the shared replica lists failed", self.hub.worker)

    def _router(self, route: str) -> "Router":
        assert self._pipeline is not None
        return self._pipeline.routers[route]
