"""Loads that run beside the engine's steps.

A request whose prefix is worth loading but slow to read (the gate's estimate above
`background_load_ms`) returns load_async=True from get_num_new_matched_tokens: vLLM parks it in
WAITING_FOR_REMOTE_KVS, keeps decoding the rest of the batch, and schedules it again once
get_finished reports its id. One thread runs those loads with a Loader of its own (on CUDA its own
stream, synchronized before the request is reported), so the forward path never waits on a disk
or a Redis.

Invariants: every submitted request is reported finished exactly once, failed or not (vLLM holds
its blocks until then, even if the request was aborted); its failed blocks are recorded before it
is reported, and the connector answers get_finished before get_block_ids_with_load_errors in each
step (vLLM's order), so a failure reaches vLLM no later than the finish, as vLLM requires.
"""

from __future__ import annotations

import logging
import queue
import threading

from kvgate.engines.vllm.kv_connector.loader import Loader
from kvgate.engines.vllm.kv_connector.specs import LoadSpec

log = logging.getLogger("vllm.kvgate")


class BackgroundLoads:
    def __init__(self, loader: Loader) -> None:
        self._loader = loader
        self._q: queue.Queue[LoadSpec | None] = queue.Queue()
        self._done: set[str] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="kvgate-kv-loader", daemon=True)
        self._thread.start()

    def submit(self, spec: LoadSpec) -> None:
        self._q.put(spec)

    def _run(self) -> None:
        while (spec := self._q.get()) is not None:
            try:
                self._loader.load(spec)
            except Exception:  # Loader.load reports its own failures; this is the last guard
                log.exception("background KV load for request %s failed; recomputing", spec.req_id)
                self._loader.fail(spec)
            finally:
                with self._lock:
                    self._done.add(spec.req_id)
                self._q.task_done()

    def take_finished(self) -> set[str]:
        with self._lock:
            out, self._done = self._done, set()
        return out

    def take_failed(self) -> set[int]:
        return self._loader.take_failed()

    def drain(self) -> None:
        self._q.join()

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)
