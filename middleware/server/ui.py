"""The dashboard: GET /ui (one page + plotly.js, served from the `plotly` package: no CDN),
GET /v1/stats (its JSON), and the task that adds one point per `stats.interval_s`.

Auth is the KeyGate's (middleware/server/auth.py): with `auth.keys` set, both need a key (Bearer, or
Basic from the browser's login prompt).
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import FastAPI, Query, Request
from fastapi.responses import FileResponse, HTMLResponse
from prometheus_client import CollectorRegistry

from kvgate.middleware.config import StatsConfig
from kvgate.middleware.telemetry.replica_scrape import fetch_texts, metrics_url, parse_metrics
from kvgate.middleware.telemetry.stats import ReplicaId, Scrape, StatsRecorder
from kvgate.middleware.telemetry.stats_samples import flatten

if TYPE_CHECKING:
    from kvgate.middleware.pipeline import Pipeline

log = logging.getLogger("kvgate.stats")
STATIC = Path(__file__).parent / "static"
ASSET_CACHE = {"cache-control": "public, max-age=86400"}


def plotly_bundle() -> Path:
    """plotly.js as the `plotly` Python package ships it (a dependency; works offline)."""
    return Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))


def add_dashboard(app: FastAPI) -> None:
    """Thin handlers, added to the app itself (its route list stays flat: tests enumerate it);
    the recorder lives on app.state.stats (made by `make_recorder`)."""
    router = app

    @router.get("/ui", response_class=HTMLResponse)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "dashboard.html", media_type="text/html", headers={"cache-control": "no-cache"})

    @router.get("/ui/dashboard.js")
    async def script() -> FileResponse:
        return FileResponse(STATIC / "dashboard.js", media_type="text/javascript", headers={"cache-control": "no-cache"})

    @router.get("/ui/plotly.min.js")
    async def plotly() -> FileResponse:
        return FileResponse(plotly_bundle(), media_type="text/javascript", headers=ASSET_CACHE)

    @router.get("/v1/stats")
    async def stats(request: Request, since: float | None = Query(None, description="only points after this time (unix s)")
                    ) -> dict[str, Any]:
        return request.app.state.stats.view(since)


def make_recorder(pipeline: "Pipeline", cfg: StatsConfig) -> tuple[StatsRecorder, dict[ReplicaId, str]]:
    """The recorder for this pipeline's routes and replicas, and the replicas' /metrics URLs."""
    replicas = {(route, r.name): metrics_url(r.api_base)
                for route, router in pipeline.routers.items() for r in router.replicas}
    recorder = StatsRecorder([r.name for r in pipeline.config.routes], list(replicas), cfg.interval_s, cfg.keep)
    # /metrics shows the engines' numbers from this recorder's last tick: one scrape of each replica
    # serves both, and a Prometheus collect never waits on a replica
    pipeline.metrics.watch_engines(recorder.engine_readings)
    return recorder, (replicas if cfg.scrape_replicas else {})


def read_scrape(registry: CollectorRegistry, texts: dict[ReplicaId, str | None], at: float) -> Scrape:
    """Collect the proxy's registry and parse the replicas' texts (in a worker thread)."""
    return Scrape(at, flatten(registry.collect()), {rid: parse_metrics(text) for rid, text in texts.items()})


async def record_stats(recorder: StatsRecorder, registry: CollectorRegistry, urls: dict[ReplicaId, str],
                       pool: Executor, interval_s: float) -> None:
    """One point per interval until cancelled; a failed tick is logged and skipped."""
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(timeout=min(interval_s, 2.0)) as client:
        while True:
            await asyncio.sleep(interval_s)
            try:
                texts = await fetch_texts(client, urls)
                scrape = await loop.run_in_executor(pool, read_scrape, registry, texts, time.time())
                recorder.advance(scrape)  # on the loop, where /v1/stats reads the ring
            except Exception:  # the dashboard must never take the proxy down
                log.exception("stats tick failed")
