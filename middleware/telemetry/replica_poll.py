"""The proxy's one reader of its replicas' /metrics: what each engine reports of its queue, its
prefill work and its KV tiers, for routing and for the dashboard alike.

One task per app (started by the proxy's lifespan) reads every replica of a route once per
`routing.engine_poll_s`, all at once, through one HTTP client whose pool keeps a connection per
replica open between reads (an engine keeps an idle connection for its keep-alive: vLLM 5 s). Of
each page only the samples kvgate reads are parsed (replica_scrape.SCRAPED), on the proxy's probes
thread, which also hands the router the engine's report (Router.engine_report, for prefill_time);
the dashboard's tick (middleware/server/ui.py) takes the last page read of each replica from
`latest` instead of fetching its own.

A route is read when its policy times requests from the engines' reports (prefill_time) or when
the dashboard shows engine numbers (`stats.scrape_replicas`); with neither, nothing is fetched.
Replicas are taken from the router at each read, so one added at run time is read from then on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Callable, Mapping

import httpx

from kvgate.middleware.routing.engine_load import EngineReport
from kvgate.middleware.telemetry.engine_metrics import ReplicaReading, replica_reading
from kvgate.middleware.telemetry.replica_scrape import SCRAPED, fetch_texts, metrics_url, parse_metrics
from kvgate.middleware.telemetry.stats import ReplicaId
from kvgate.middleware.telemetry.stats_samples import Samples

if TYPE_CHECKING:
    from kvgate.middleware.routing.router import Router

log = logging.getLogger("kvgate.stats")


def engine_report(reading: ReplicaReading) -> EngineReport:
    """What the router needs of a replica's reading (pure)."""
    return EngineReport(
        running=reading.running,
        waiting=reading.waiting,
        prefill_tokens=reading.prefill_tokens,
        prefill_seconds=reading.prefill_seconds,
        prefill_requests=reading.prefill_requests,
    )


def polled_routes(routers: Mapping[str, "Router"], dashboard: bool) -> dict[str, float]:
    """Route → seconds between reads, for the routes that need their replicas read (pure)."""
    return {name: router.cfg.engine_poll_s for name, router in routers.items() if dashboard or router.reads_engine_load}


class ReplicaPoller:
    """Reads the replicas of `routes` (route → interval) and keeps the last page of each."""

    def __init__(
        self, routers: Mapping[str, "Router"], routes: Mapping[str, float], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.routers = routers
        self.routes = dict(routes)
        self._clock = clock
        # the last page read of each replica (None: it did not answer that read); replaced whole at
        # each read, so a reader on another task never sees it half made
        self.latest: Mapping[ReplicaId, Samples | None] = {}
        self.reads = 0  # rounds done (tests, logs)

    async def run(self, pool: Executor, client: Callable[[float], Any] | None = None) -> None:
        """Read each route when it is due, until cancelled; a failed round is logged and skipped.
        `client(timeout)`: the HTTP client the rounds share (httpx's interface: `get`, `async with`)."""
        if not self.routes:
            return
        # a replica that does not answer delays its round by at most this, and a loaded machine's
        # slow answer still counts at the shortest intervals
        timeout = min(2.0, max(0.5, min(self.routes.values())))
        due = {route: self._clock() for route in self.routes}
        async with client(timeout) if client is not None else httpx.AsyncClient(timeout=timeout) as http:
            while True:
                now = self._clock()
                todo = [route for route, at in due.items() if at <= now]
                if todo:
                    try:
                        await self.read(http, todo, pool)
                    except Exception:  # routing and the dashboard go on without engine numbers
                        log.exception("reading the replicas' /metrics failed")
                    for route in todo:
                        due[route] = max(due[route] + self.routes[route], self._clock())
                await asyncio.sleep(max(0.0, min(due.values()) - self._clock()))

    async def read(self, client: httpx.AsyncClient, routes: list[str], pool: Executor) -> None:
        """One read of every replica of `routes`."""
        urls = {
            (route, r.name): metrics_url(r.api_base) for route in routes for r in list(self.routers[route].replicas)
        }
        texts = await fetch_texts(client, urls)
        pages = await asyncio.get_running_loop().run_in_executor(pool, self._digest, texts)
        self.latest = {**self.latest, **pages}
        self.reads += 1

    def _digest(self, texts: Mapping[ReplicaId, str | None]) -> dict[ReplicaId, Samples | None]:
        """Parse the pages and report each engine to its router (on the probes thread)."""
        pages: dict[ReplicaId, Samples | None] = {}
        for (route, name), text in texts.items():
            samples = pages[(route, name)] = parse_metrics(text, SCRAPED)
            reading = replica_reading(samples) if samples is not None else None
            if reading is not None:
                self.routers[route].engine_report(name, engine_report(reading))
        return pages
