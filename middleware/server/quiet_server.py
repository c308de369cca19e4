"""uvicorn's server with a once-a-second main loop, for `kvgate serve` and its workers.

uvicorn's main loop wakes ten times a second, busy or idle, to refresh its Date header (which
changes once a second) and to notice a shutdown signal. Here the loop wakes once a second, and a
shutdown signal (or `stop()`) wakes it at once, so shutting down is as prompt as before and an
idle proxy wakes less often. What each tick does is uvicorn's own (`on_tick`).

`server_config` is the uvicorn config both run with: uvicorn's own, except that a response's head
goes out in one write with its first body bytes (kvgate.middleware.server.one_write).
"""

from __future__ import annotations

import asyncio
from types import FrameType
from typing import Any

import uvicorn

from kvgate.middleware.server.one_write import OneWriteHttp

TICK_S = 1.0
TICKS_PER_S = 10  # the counter uvicorn's on_tick reads advances ten per second


def _wake(nap: "asyncio.Future[None] | None") -> None:
    if nap is not None and not nap.done():
        nap.set_result(None)


class QuietServer(uvicorn.Server):
    """`run()` as uvicorn's Server; `stop()` from any thread."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._nap: asyncio.Future[None] | None = None

    async def main_loop(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + TICKS_PER_S) % 864000
            self._nap = nap = loop.create_future()
            if self.should_exit:  # a signal came while the last tick ran
                nap.set_result(None)
            timer = loop.call_later(TICK_S, _wake, nap)
            try:
                await nap
            finally:
                timer.cancel()
            should_exit = await self.on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._wake_loop()

    def stop(self) -> None:
        """Shut down as a SIGTERM would."""
        self.should_exit = True
        self._wake_loop()

    def _wake_loop(self) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(_wake, self._nap)
            except RuntimeError:  # the loop closed meanwhile: nothing to wake
                pass


def server_config(app: Any, **options: Any) -> uvicorn.Config:
    """uvicorn's config for `app` with `options`, on the one-write protocol unless `http` is given."""
    return uvicorn.Config(app, **{"http": OneWriteHttp, **options})


STARTUP_FAILURE = 3  # uvicorn.run's exit status when the server never started


def serve(app: Any, **options: Any) -> int:
    """Run `app` as uvicorn.run would (one process, no reload); the exit status."""
    server = QuietServer(server_config(app, **options))
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    return 0 if server.started else STARTUP_FAILURE
