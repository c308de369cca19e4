"""A small LRU mapping for the prompt hasher's caches (kvgate.index.kv.prompt).

Not thread-safe by itself: its owner holds a lock around every call.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable


class LRU(OrderedDict):
    """Invariant: after `put` / `put_all`, at most `size` entries, the most recently used last."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def get_touch(self, key: Any) -> Any:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def put(self, key: Any, value: Any) -> None:
        self.put_all(((key, value),))

    def put_all(self, items: Iterable[tuple[Any, Any]]) -> None:
        """Each (key, value) in turn becomes the most recently used; then the oldest go while over size."""
        move = self.move_to_end
        for key, value in items:
            self[key] = value  # an old key keeps its place: moved next
            move(key)
        while len(self) > self.size:
            self.popitem(last=False)
