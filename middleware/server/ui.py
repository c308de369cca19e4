"""The dashboard: GET /ui (one page + plotly.js, served from static/ beside it: no CDN),
GET /v1/stats (its JSON), and the task that adds one point per `stats.interval_s` (the replicas'
numbers from the proxy's one reader of their /metrics, middleware/telemetry/replica_poll.py, which
reads them while these two are asked for: `ReplicaPoller.watch`).

Auth is the KeyGate's (middleware/server/auth.py): with `auth.keys` set, both need a key (Bearer, or
Basic from the browser's login prompt).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from fastapi import FastAPI, Query, Request
from fastapi.responses import FileResponse, HTMLResponse
from prometheus_client import CollectorRegistry

from kvgate.middleware.config import StatsConfig
from kvgate.middleware.telemetry.stats import OWN_SAMPLES, ReplicaId, Scrape, StatsRecorder
from kvgate.middleware.telemetry.stats_samples import Samples, flatten

if TYPE_CHECKING:
    from kvgate.middleware.pipeline import Pipeline

log = logging.getLogger("kvgate.stats")
STATIC = Path(__file__).parent / "static"
ASSET_CACHE = {"cache-control": "public, max-age=86400"}


def plotly_bundle() -> Path:
    """plotly.js (MIT), the one file of the `plotly` Python package the page uses, kept in static/:
    the package would add ~70 MB to the core install for it."""
    return STATIC / "plotly.min.js"


def add_dashboard(app: FastAPI) -> None:
    """Thin handlers, added to the app itself (its route list stays flat: tests enumerate it);
    the recorder lives on app.state.stats (made by `make_recorder`)."""
    router = app

    @router.get("/ui", response_class=HTMLResponse)
    async def page(request: Request) -> FileResponse:
        request.app.state.replica_poller.watch()  # the engines' numbers are read while the page is open
        return FileResponse(STATIC / "dashboard.html", media_type="text/html", headers={"cache-control": "no-cache"})

    @router.get("/ui/dashboard.js")
    async def script() -> FileResponse:
        return FileResponse(
            STATIC / "dashboard.js", media_type="text/javascript", headers={"cache-control": "no-cache"}
        )

    @router.get("/ui/plotly.min.js")
    async def plotly() -> FileResponse:
        return FileResponse(plotly_bundle(), media_type="text/javascript", headers=ASSET_CACHE)

    @router.get("/v1/stats")
    async def stats(
        request: Request, since: float | None = Query(None, description="only points after this time (unix s)")
    ) -> dict[str, Any]:
        request.app.state.replica_poller.watch()
        return request.app.state.stats.view(since)


def make_recorder(pipeline: "Pipeline", cfg: StatsConfig) -> StatsRecorder:
    """The recorder for this pipeline's routes and replicas."""
    replicas = [(route, r.name) for route, router in pipeline.routers.items() for r in router.replicas]
    return StatsRecorder([r.name for r in pipeline.config.routes], replicas, cfg.interval_s, cfg.keep)


def read_scrape(registry: CollectorRegistry, pages: Mapping[ReplicaId, Samples | None], at: float) -> Scrape:
    """Collect the samples of the proxy's registry a point reads (in a worker thread); the
    replicas' pages are parsed already."""
    return Scrape(at, flatten(registry.restricted_registry(OWN_SAMPLES).collect()), dict(pages))


async def record_stats(
    recorder: StatsRecorder,
    registry: CollectorRegistry,
    pages: Callable[[], Mapping[ReplicaId, Samples | None]],
    pool: Executor,
    interval_s: float,
) -> None:
    """One point per interval until cancelled, with the replicas' last pages read (`pages()`: the
    poller's, ReplicaPoller.latest); a failed tick is logged and skipped."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval_s)
        try:
            scrape = await loop.run_in_executor(pool, read_scrape, registry, pages(), time.time())
            recorder.advance(scrape)  # on the loop, where /v1/stats reads the ring
        except Exception:  # the dashboard must never take the proxy down
            log.exception("stats tick failed")
