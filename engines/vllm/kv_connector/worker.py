"""The worker side: copies between vLLM's paged KV and chunks (paged.py, loader.py), and the
background saver.

Saving copies a chunk's blocks out right after the forward pass (a CPU copy; on a GPU a
device-to-pinned-host copy on a side stream into a staging buffer, ordered by a CUDA event) and
hands them to one background thread that quantizes, encodes and writes them to every tier, then
gives the buffer back: the forward path pays only for launching the copy. When the writer falls
behind by `save_queue` chunks, new saves are dropped and counted (a later request recomputes;
decoding never waits).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

import torch

from kvgate.engines.vllm.kv_connector.loader import Loader
from kvgate.engines.vllm.kv_connector.paged import PagedKV
from kvgate.engines.vllm.kv_connector.specs import Counters, LoadSpec, SaveSpec

log = logging.getLogger("vllm.kvgate")


class Saver:
    """One background writer: put_many of each gathered chunk, then `on_stored(spec)`."""

    def __init__(self, store: Any, depth: int, counters: Counters, on_stored: Callable[[SaveSpec], None]) -> None:
        self._store, self._counters, self._on_stored = store, counters, on_stored
        self._q: queue.Queue[tuple[SaveSpec, list[torch.Tensor], Any] | None] = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name="kvgate-kv-saver", daemon=True)
        self._thread.start()

    def submit(self, spec: SaveSpec, rows: list[torch.Tensor], done: Any) -> bool:
        try:
            self._q.put_nowait((spec, rows, done))
            return True
        except queue.Full:
            self._counters.dropped_saves += 1
            if done is not None:
                done.release()
            return False

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            spec, rows, done = item
            t0 = time.perf_counter()
            try:
                if done is not None:
                    done.wait()
                self._store.put_many([spec.chunk_hash], [rows], salt=spec.salt)
                self._counters.saved_chunks += 1
                self._on_stored(spec)
            except Exception:  # a failing tier costs a later recompute, never the engine
                log.exception("saving a KV chunk failed")
            finally:
                if done is not None:
                    done.release()  # the staging buffer goes back to the pool once encoded
                self._counters.save_write_s += time.perf_counter() - t0
                self._q.task_done()

    def drain(self) -> None:
        self._q.join()

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)


__all__ = ["Counters", "LoadSpec", "Loader", "PagedKV", "SaveSpec", "Saver"]
