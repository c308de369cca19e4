"""What the connector's two instances hand each other through vLLM, once per engine step.

KvgateMetadata goes from the scheduler to every worker, inside the step's scheduler output
(build_connector_meta makes it, bind_connector_metadata receives it): the chunks to load into
which blocks, the blocks to save as which chunk. KvgateEvents goes back, inside the model
runner's output (get_kv_connector_kv_cache_events takes it from the worker's EventBuffer): the
tiers' BlockStored/BlockRemoved, which the scheduler publishes with the engine's own KV events.
Both are serialized between processes, so they hold plain data only.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterable

from vllm.distributed.kv_events import KVCacheEvent, KVConnectorKVEvents
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from kvgate.engines.vllm.kv_connector.specs import LoadSpec, SaveSpec


@dataclass
class KvgateMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
    step_tokens: int = 0  # tokens this step computes (the gate times prefill-heavy steps)


class KvgateEvents(KVConnectorKVEvents):
    """The worker's events of one step. With several workers (tensor parallel), vLLM's output
    aggregator adds the other workers' events to the first one's (add_events, increment_workers)
    before the scheduler reads them (get_all_events); aggregate is the identity."""

    def __init__(self, events: list[KVCacheEvent] | None = None) -> None:
        self._events = list(events or [])
        self._workers = 1

    def add_events(self, events: list[KVCacheEvent]) -> None:
        self._events.extend(events)

    def aggregate(self) -> "KvgateEvents":
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._workers += count

    def get_all_events(self) -> list[KVCacheEvent]:
        return self._events

    def get_number_of_workers(self) -> int:
        return self._workers

    def clear_events(self) -> None:
        self._events = []


class EventBuffer:
    """A worker's tier events between two steps: appended by the background writer (chunks stored)
    and by store evictions (from whichever thread wrote), taken once per step."""

    def __init__(self) -> None:
        self._events: list[KVCacheEvent] = []
        self._lock = threading.Lock()

    def add(self, events: Iterable[KVCacheEvent]) -> None:
        with self._lock:
            self._events.extend(events)

    def take(self) -> KvgateEvents | None:
        with self._lock:
            if not self._events:
                return None
            out, self._events = self._events, []
        return KvgateEvents(out)
