"""One miss followed from the ASGI handler to the replica and back: control enters the pipeline's
module from another module once (`acomplete`: the pipeline looks up, forwards and records; the
cache and the forwarder never call back into it, nor does what runs on a worker thread or as the
client reads a stream), for each transport and with and without streaming.

Counted with a profile hook on every thread: a new frame (a call, not the resumption of a
coroutine already running: each await resumes every frame of the task's chain) whose code is in
middleware/pipeline.py and whose caller's code is not.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

import kvgate.middleware.pipeline
from kvgate.engines.demo import Calls, create_fake_app
from kvgate.middleware.build import build_pipeline
from kvgate.middleware.server.proxy import create_app
from kvgate.tools.bench.procs import ServerThread
from tests.conftest import one_replica_config

PIPELINE = kvgate.middleware.pipeline.__file__  # as the interpreter names its code (co_filename)
ENTRIES = 1


class Entries:
    """Counts calls into PIPELINE from frames of other files."""

    def __init__(self) -> None:
        self.count = 0
        self.where: list[str] = []
        self._seen: set[int] = set()  # frames already counted (their resumptions are not entries)
        self._frames: list[Any] = []  # held, so a counted frame's id is not reused meanwhile
        self._lock = threading.Lock()

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call" or frame.f_code.co_filename != PIPELINE:
            return
        caller = frame.f_back
        if caller is not None and caller.f_code.co_filename == PIPELINE:
            return
        with self._lock:
            if id(frame) in self._seen:
                return
            self._seen.add(id(frame))
            self._frames.append(frame)
            self.count += 1
            self.where.append(f"{frame.f_code.co_name} <- {caller.f_code.co_filename if caller else '?'}")


@pytest.mark.parametrize("forward", ["relay", "litellm"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_miss_enters_the_pipeline_once(tmp_path: Path, forward: str, stream: bool) -> None:
    replica = ServerThread(create_fake_app(Calls())).start()
    config = one_replica_config(tmp_path / "cache", replica.url, routing={"forward": forward})
    pipeline = build_pipeline(config)
    app = create_app(config, pipeline)
    entries = Entries()
    body = {"model": "smollm2", "stream": stream, "messages": [{"role": "user", "content": f"a miss {forward}"}]}

    async def one_miss() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://kvgate") as client,
        ):
            warm = await client.post(
                "/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "warm"}]}
            )
            assert warm.status_code == 200, warm.text  # engines discovered, pools open: the steady state
            threading.setprofile(entries)  # the worker threads the loop starts from here on
            sys.setprofile(entries)
            try:
                return await client.post("/v1/chat/completions", json=body)
            finally:
                sys.setprofile(None)
                threading.setprofile(None)  # type: ignore[arg-type]

    try:
        response = asyncio.run(one_miss())
        assert response.status_code == 200, response.text
        assert response.headers["x-kvgate-cache"] == "miss"
        assert entries.count == ENTRIES, entries.where
    finally:
        pipeline.close()
        replica.stop()
