"""The proxy's one reader of its replicas' /metrics: what each engine reports of its queue, its
prefill work and its KV tiers, for routing and for the dashboard alike.

One task per app (started by the proxy's lifespan) reads the replicas of a route once per
`routing.engine_poll_s`, all at once, through one HTTP client whose pool keeps a connection per
replica open between reads (an engine keeps an idle connection for its keep-alive: vLLM 5 s). Of
each page only the samples kvgate reads are parsed (replica_scrape.SCRAPED), on the proxy's probes
thread, which also hands the router the engine's report (Router.engine_report, for prefill_time);
the dashboard's tick (middleware/server/ui.py) takes the pages read since its last point from
`pages`, and kvgate's own /metrics exports `readings`.

Each read costs the engine: vLLM renders its whole page (about 50 KB) on the API server's event
loop, the one that streams every request's tokens. So a route is read every interval only when
its policy routes on the engines' reports (prefill_time) or `stats.scrape_replicas` is `always`;
with `watched` (the default) its replicas are read while someone looks: for `WATCH_S` after each
request for the dashboard (`watch`), and once, on demand, for a scrape of kvgate's /metrics that
finds them older than their interval (`fresh`). With neither, nothing is fetched. Replicas are
taken from the router at each read, so one added at run time is read from then on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple

import httpx

from kvgate.middleware.config import ScrapeMode
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


WATCH_S = 30.0  # how long one look at the dashboard keeps display-only replicas read


class Poll(NamedTuple):
    """How one route's replicas are read: every `interval_s`, always or only while watched."""

    interval_s: float
    always: bool


def polled_routes(routers: Mapping[str, "Router"], scrape: ScrapeMode) -> dict[str, Poll]:
    """Route → how its replicas are read, for the routes anything reads (pure): always where the
    policy routes on the engines' reports or `scrape` is "always", while watched where it is
    "watched", not at all otherwise."""
    out: dict[str, Poll] = {}
    for name, router in routers.items():
        always = router.reads_engine_load or scrape == "always"
        if always or scrape == "watched":
            out[name] = Poll(router.cfg.engine_poll_s, always)
    return out


class ReplicaPoller:
    """Reads the replicas of `routes` (route → Poll) and keeps the last page of each."""

    def __init__(
        self,
        routers: Mapping[str, "Router"],
        routes: Mapping[str, Poll],
        clock: Callable[[], float] = time.monotonic,
        watch_s: float = WATCH_S,
    ) -> None:
        self.routers = routers
        self.routes = dict(routes)
        self._clock = clock
        self.watch_s = watch_s
        # the last page read of each replica (None: it did not answer that read) and when it was
        # read; both replaced whole at each read, so a reader on another task never sees one half made
        self.latest: Mapping[ReplicaId, Samples | None] = {}
        self.read_at: Mapping[ReplicaId, float] = {}
        self._readings: Mapping[ReplicaId, ReplicaReading] = {}
        self.reads = 0  # rounds done (tests, logs)
        self._watched_until = -math.inf
        self._asked = False  # a scrape of /metrics wants the watched routes read once
        self._wake: asyncio.Event | None = None  # made by `run`, on its loop
        self._rounds: list[asyncio.Future[None]] = []  # `fresh` callers waiting for the next read

    def watch(self) -> None:
        """Someone looks at the dashboard: read the watched routes for the next `watch_s`."""
        self._watched_until = self._clock() + self.watch_s
        if self._wake is not None:
            self._wake.set()

    async def fresh(self, timeout: float) -> None:
        """Wait (at most `timeout` s) for a read of every replica whose last one is older than its
        route's interval: kvgate's /metrics then shows current numbers while nobody watches."""
        now = self._clock()
        stale = any(
            self.read_at.get((route, r.name), -math.inf) < now - poll.interval_s
            for route, poll in self.routes.items()
            for r in list(self.routers[route].replicas)
        )
        if not stale or self._wake is None:
            return
        done = asyncio.get_running_loop().create_future()
        self._rounds.append(done)
        self._asked = True
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout)
        except asyncio.TimeoutError:
            pass

    def pages(self, max_age: float) -> dict[ReplicaId, Samples | None]:
        """The pages read within the last `max_age` s (the dashboard's point: an older one is a gap,
        not a repeat of the last numbers)."""
        since = self._clock() - max_age
        return {rid: page for rid, page in self.latest.items() if self.read_at.get(rid, -math.inf) >= since}

    def readings(self) -> Mapping[ReplicaId, ReplicaReading]:
        """Each replica's last recognised reading, read within twice its route's interval (what
        kvgate's /metrics exports: a replica not read since is absent, not shown with stale numbers)."""
        now = self._clock()
        return {
            rid: reading
            for rid, reading in self._readings.items()
            if rid[0] in self.routes and self.read_at.get(rid, -math.inf) >= now - 2 * self.routes[rid[0]].interval_s
        }

    async def run(self, pool: Executor, client: Callable[[float], Any] | None = None) -> None:
        """Read each route when it is due and read, until cancelled; a failed round is logged and
        skipped. `client(timeout)`: the HTTP client the rounds share (httpx's interface: `get`,
        `async with`)."""
        if not self.routes:
            return
        self._wake = wake = asyncio.Event()
        # a replica that does not answer delays its round by at most this, and a loaded machine's
        # slow answer still counts at the shortest intervals
        timeout = min(2.0, max(0.5, min(poll.interval_s for poll in self.routes.values())))
        due = {route: self._clock() for route in self.routes}
        async with client(timeout) if client is not None else httpx.AsyncClient(timeout=timeout) as http:
            while True:
                now = self._clock()
                # the `fresh` callers this round answers: those that asked before it started
                asked, self._asked, rounds, self._rounds = self._asked, False, self._rounds, []
                open_ = asked or now < self._watched_until
                todo = [r for r, at in due.items() if (at <= now or asked) and (self.routes[r].always or open_)]
                if todo:
                    try:
                        await self.read(http, todo, pool)
                    except Exception:  # routing and the dashboard go on without engine numbers
                        log.exception("reading the replicas' /metrics failed")
                    for route in todo:
                        due[route] = max(due[route] + self.routes[route].interval_s, self._clock())
                for done in rounds:
                    if not done.done():
                        done.set_result(None)
                now = self._clock()
                waiting = [at for r, at in due.items() if self.routes[r].always or now < self._watched_until]
                wake.clear()
                if self._asked:  # asked while this round ran
                    continue
                nap = max(0.0, min(waiting) - now) if waiting else None
                try:
                    await asyncio.wait_for(wake.wait(), nap)
                except asyncio.TimeoutError:
                    pass

    async def read(self, client: httpx.AsyncClient, routes: list[str], pool: Executor) -> None:
        """One read of every replica of `routes`."""
        urls = {
            (route, r.name): metrics_url(r.api_base) for route in routes for r in list(self.routers[route].replicas)
        }
        texts = await fetch_texts(client, urls)
        pages, readings = await asyncio.get_running_loop().run_in_executor(pool, self._digest, texts)
        at = self._clock()
        self.latest = {**self.latest, **pages}
        self.read_at = {**self.read_at, **dict.fromkeys(pages, at)}
        self._readings = {**{rid: r for rid, r in self._readings.items() if rid not in pages}, **readings}
        self.reads += 1

    def _digest(
        self, texts: Mapping[ReplicaId, str | None]
    ) -> tuple[dict[ReplicaId, Samples | None], dict[ReplicaId, ReplicaReading]]:
        """Parse the pages and report each engine to its router (on the probes thread)."""
        pages: dict[ReplicaId, Samples | None] = {}
        readings: dict[ReplicaId, ReplicaReading] = {}
        for (route, name), text in texts.items():
            samples = pages[(route, name)] = parse_metrics(text, SCRAPED)
            reading = replica_reading(samples) if samples is not None else None
            if reading is not None:
                readings[(route, name)] = reading
                self.routers[route].engine_report(name, engine_report(reading))
        return pages, readings
