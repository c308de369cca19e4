"""MemoryTier: encoded chunks in RAM, least recently used evicted first under a byte budget."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Iterator


class MemoryTier:
    """LRU byte store in process memory.

    Invariants (under `self._lock`): `self._bytes == sum(len(v) for v in self._items.values())
    <= self.budget_bytes`; `self._items` is ordered least recently used first. Only len(value)
    is charged to the budget (keys and dict overhead are small next to MB-sized chunks).
    """

    name = "memory"
    in_process = True  # the engine process's own RAM: never sealed (kvgate.index.kv.chunks.sealing)

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0")
        self.budget_bytes = budget_bytes
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0
        self.rejected = 0  # puts refused because the value alone exceeds the budget
        self._watchers: list[Callable[[list[str]], None]] = []

    def watch_evictions(self, callback: Callable[[list[str]], None]) -> None:
        """Call `callback(keys)` after a put evicted `keys` (in the putting thread, outside the
        lock). Deletes and clears are not evictions and are not reported."""
        self._watchers.append(callback)

    def get(self, key: str) -> bytes | None:
        with self._lock:
            data = self._items.get(key)
            if data is not None:
                self._items.move_to_end(key)
            return data

    def put(self, key: str, data: bytes) -> bool:
        size = len(data)
        evicted: list[str] = []
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return True
            if size > self.budget_bytes:
                self.rejected += 1
                return False
            while self._bytes + size > self.budget_bytes:
                old_key, old = self._items.popitem(last=False)
                self._bytes -= len(old)
                self.evictions += 1
                evicted.append(old_key)
            self._items[key] = bytes(data)  # no-op for bytes; freezes a bytearray
            self._bytes += size
        if evicted:
            for watch in self._watchers:
                watch(evicted)
        return True

    def contains(self, key: str) -> bool:
        with self._lock:
            return key in self._items

    def delete(self, key: str) -> None:
        with self._lock:
            data = self._items.pop(key, None)
            if data is not None:
                self._bytes -= len(data)

    def keys(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._items))

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "items": len(self._items),
                "bytes": self._bytes,
                "budget_bytes": self.budget_bytes,
                "evictions": self.evictions,
                "rejected": self.rejected,
            }

    def close(self) -> None:
        self.clear()
