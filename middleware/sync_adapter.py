"""The sync face of the async core: one private event loop, run in a daemon thread.

Sync callers (`Pipeline.complete`, hence `Gateway.completion`) hand a coroutine to the loop and
wait for its result; an async stream becomes a sync iterator whose every `next` runs one step of
it on the loop. The loop is private and lives as long as its owner because LiteLLM's async
clients bind to the loop that created them: a fresh `asyncio.run` per call, or the caller's own
loop, would hand them a dead or foreign one. Many threads may call at once; their calls run
concurrently on the one loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator, Coroutine, Iterator, TypeVar

T = TypeVar("T")


class SyncAdapter:
    """Runs coroutines and async iterators for sync callers on a loop of its own (started on
    first use, stopped by `close`; a later call starts a new one)."""

    def __init__(self, name: str = "kvgate-sync") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and return its result; its exception is raised here as is."""
        try:
            loop = self._started()
        except RuntimeError:
            coro.close()
            raise
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # the caller gave up (KeyboardInterrupt…): stop the work too
            raise

    def iterate(self, stream: AsyncIterator[T]) -> "SyncIterator[T]":
        """`stream` as a sync iterator (see SyncIterator)."""
        return SyncIterator(self, stream)

    def submit(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Start `coro` without waiting, if the loop runs (else drop it); safe from any thread,
        finalizers and the loop's own thread included."""
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            return
        try:
            asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # closed between the check and the call
            coro.close()

    def close(self) -> None:
        """Cancel what still runs, close open async generators, stop the loop and its thread."""
        with self._lock:
            if threading.current_thread() is self._thread:
                raise RuntimeError("SyncAdapter.close() called from its own loop")
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(_drain(loop), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_serve, args=(loop,), name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            if threading.current_thread() is self._thread:
                # waiting here for the loop we are running on would never return
                raise RuntimeError("a sync kvgate call from inside kvgate's own loop; use the async API")
            return self._loop


class SyncIterator(Iterator[T]):
    """A sync view of an async iterator that runs on a SyncAdapter's loop.

    `close()` (or dropping the iterator) closes the async iterator on the loop: a caller that
    stops reading a stream thereby cancels the backend call behind it, and an abandoned answer
    is never stored. `close()` waits for that; a finalizer only starts it.
    """

    def __init__(self, adapter: SyncAdapter, stream: AsyncIterator[T]) -> None:
        self._adapter = adapter
        self._stream = stream
        self._done = False

    def __iter__(self) -> "SyncIterator[T]":
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        try:
            more, item = self._adapter.run(_step(self._stream))
        except BaseException:
            self._done = True  # an async iterator that raised is finished
            raise
        if not more:
            self._done = True
            raise StopIteration
        return item

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._adapter.run(_aclose(self._stream))

    def __del__(self) -> None:
        if not getattr(self, "_done", True):
            self._done = True
            self._adapter.submit(_aclose(self._stream))


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


async def _step(stream: AsyncIterator[T]) -> tuple[bool, T | None]:
    """(True, next item), or (False, None) at the end (StopAsyncIteration does not cross threads)."""
    try:
        return True, await stream.__anext__()
    except StopAsyncIteration:
        return False, None


async def _aclose(stream: AsyncIterator[Any]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


async def _drain(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await loop.shutdown_asyncgens()
    await loop.shutdown_default_executor()
