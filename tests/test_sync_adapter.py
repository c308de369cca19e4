"""The sync face over the async core (kvgate.middleware.sync_adapter): results and exceptions cross the
thread as they are, many threads share the one loop, and a sync stream the caller abandons closes
the async one behind it, down to the backend's HTTP stream, storing nothing."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from kvgate import Gateway
from kvgate.engines.demo import create_fake_app
from kvgate.middleware.config import parse_config
from kvgate.middleware.errors import BackendError
from kvgate.middleware.sync_adapter import SyncAdapter
from kvgate.tools.bench.procs import ServerThread


class Boom(Exception):
    pass


@pytest.fixture
def adapter() -> Iterator[SyncAdapter]:
    a = SyncAdapter()
    yield a
    a.close()


# ---------------------------------------------------------------------------- the adapter alone
def test_results_and_exceptions_cross_with_their_type(adapter: SyncAdapter) -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    async def fail() -> None:
        await asyncio.sleep(0)
        raise Boom("from the loop")

    assert adapter.run(answer()) == 42
    with pytest.raises(Boom, match="from the loop"):
        adapter.run(fail())

    async def breaks_midway() -> AsyncIterator[int]:
        yield 1
        raise Boom("mid-stream")

    it = adapter.iterate(breaks_midway())
    assert next(it) == 1
    with pytest.raises(Boom, match="mid-stream"):
        next(it)
    assert list(it) == []  # finished, like a generator that raised


def test_threads_share_one_loop_concurrently(adapter: SyncAdapter) -> None:
    """Eight threads at once: each coroutine waits for all eight, which only ends if they run
    concurrently on the one loop."""
    n, arrived, loops = 8, [0], set()
    all_here = asyncio.Event()  # created outside a loop; bound to the adapter's on first wait

    async def meet() -> str:
        loops.add(id(asyncio.get_running_loop()))
        arrived[0] += 1
        if arrived[0] == n:
            all_here.set()
        await asyncio.wait_for(all_here.wait(), timeout=10)
        return threading.current_thread().name

    with ThreadPoolExecutor(n) as pool:
        names = list(pool.map(lambda _: adapter.run(meet()), range(n)))
    assert names == ["kvgate-sync"] * n and len(loops) == 1


def test_abandoned_iterator_closes_the_async_one(adapter: SyncAdapter) -> None:
    closed = threading.Event()

    async def numbers() -> AsyncIterator[int]:
        try:
            for i in range(1000):
                yield i
        finally:
            closed.set()

    it = adapter.iterate(numbers())
    assert [next(it), next(it)] == [0, 1]
    it.close()  # explicit: waits for the close
    assert closed.is_set()

    closed.clear()
    it = adapter.iterate(numbers())
    next(it)
    del it  # dropped: the finalizer starts the close on the loop
    gc.collect()
    assert closed.wait(5)


def test_sync_call_from_the_loop_itself_fails_fast(adapter: SyncAdapter) -> None:
    async def nested() -> None:
        async def inner() -> None:
            return None

        adapter.run(inner())  # would wait on the loop it blocks

    with pytest.raises(RuntimeError, match="own loop"):
        adapter.run(nested())


def test_close_ends_open_streams_and_a_later_call_restarts(adapter: SyncAdapter) -> None:
    closed = threading.Event()

    async def forever() -> AsyncIterator[int]:
        try:
            while True:
                yield 0
                await asyncio.sleep(0)
        finally:
            closed.set()

    it = adapter.iterate(forever())
    next(it)
    adapter.close()
    assert closed.is_set()

    async def one() -> int:
        return 1

    assert adapter.run(one()) == 1


# ---------------------------------------------------------------------------- through the Gateway
def _config(api_base: str, cache_dir: Any) -> dict[str, Any]:
    return {
        "cache_dir": str(cache_dir),
        "routes": [
            {
                "name": "chat",
                "model": "demo-*",
                "backend": {"model": "openai/served-name", "api_base": api_base, "api_key": "sk-x"},
                "semantic": {"enabled": False},  # exact tier only: no embedder to load
            }
        ],
    }


class SlowStream:
    """A backend that streams 1000 words, one every 20 ms, and notes whether its client left."""

    def __init__(self) -> None:
        self.cut, self.finished = threading.Event(), threading.Event()
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> StreamingResponse:
            body = await request.json()
            return StreamingResponse(self._events(body.get("model", "m")), media_type="text/event-stream")

        self.server = ServerThread(app).start()
        self.api_base = f"{self.server.url}/v1"

    async def _events(self, model: str) -> AsyncIterator[str]:
        base = {"id": "chatcmpl-slow", "object": "chat.completion.chunk", "created": int(time.time()), "model": model}

        def event(delta: dict[str, Any], finish: str | None = None) -> str:
            return (
                f"data: {json.dumps({**base, 'choices': [{'index': 0, 'delta': delta, 'finish_reason': finish}]})}\n\n"
            )

        try:
            yield event({"role": "assistant", "content": ""})
            for i in range(1000):
                yield event({"content": f"w{i} "})
                await asyncio.sleep(0.02)
            yield event({}, "stop")
            yield "data: [DONE]\n\n"
            self.finished.set()
        finally:
            if not self.finished.is_set():
                self.cut.set()


@pytest.fixture
def slow(tmp_path: Any) -> Iterator[tuple[SlowStream, Gateway]]:
    backend = SlowStream()
    gateway = Gateway(parse_config(_config(backend.api_base, tmp_path / "cache")))
    yield backend, gateway
    gateway.close()
    backend.server.stop()


@pytest.mark.parametrize("how", ["close", "drop"])
def test_abandoned_sync_stream_cancels_the_backend_and_stores_nothing(
    slow: tuple[SlowStream, Gateway], how: str
) -> None:
    backend, gateway = slow
    stream = gateway.completion(
        model="demo-1", messages=[{"role": "user", "content": "Tell a long story"}], stream=True
    )
    read = [next(stream) for _ in range(3)]
    info = stream.kvgate
    assert info.cache == "miss" and read[1].choices[0].delta.content == "w0 "
    if how == "close":
        stream.close()
    else:
        del stream
        gc.collect()
    assert backend.cut.wait(10), "the backend kept streaming to a client that left"
    assert not backend.finished.is_set()
    assert info.stored is False and len(gateway.pipeline.index) == 0


def test_sync_calls_from_many_threads(backend: Any, tmp_path: Any) -> None:
    with Gateway(parse_config(_config(backend.api_base, tmp_path / "cache"))) as gateway:

        def ask(i: int) -> tuple[str, str, str]:
            question = f"Question number {i}?"
            full = gateway.completion(model="demo-1", messages=[{"role": "user", "content": question}])
            chunks = gateway.completion(model="demo-1", messages=[{"role": "user", "content": question}], stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            return question, full.choices[0].message.content, text + "|" + chunks.kvgate.cache

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, range(16)))
    for question, full, streamed in answers:
        assert full.endswith(question) and streamed == f"{full}|exact"  # the stream hit the stored answer


def test_core_exceptions_surface_in_the_sync_caller(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    breaking = ServerThread(create_fake_app(break_streams_after=2)).start()
    try:
        with Gateway(parse_config(_config(f"{breaking.url}/v1", tmp_path / "cache"))) as gateway:
            stream = gateway.completion(
                model="demo-1", messages=[{"role": "user", "content": "one two three four five"}], stream=True
            )
            with pytest.raises(BackendError):
                list(stream)
            assert len(gateway.pipeline.index) == 0

            async def boom(*args: Any, **kwargs: Any) -> Any:
                raise Boom("inside the core")

            monkeypatch.setattr(gateway.pipeline.forwarders["chat"], "forward", boom)
            with pytest.raises(Boom, match="inside the core"):
                gateway.completion(model="demo-1", messages=[{"role": "user", "content": "hi"}])
    finally:
        breaking.stop()
