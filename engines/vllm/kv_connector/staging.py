"""A pool of reusable host buffers for the copies between the tiers and the engine's KV.

On a CUDA engine the buffers are pinned, so a host-to-device or device-to-host copy runs
asynchronously at full bus speed (pageable memory moves at a fraction of it, and pinning a buffer
costs far more than the copy: allocating one per chunk would undo the point). Loads pack a group
of chunks into one buffer and move it with one copy; saves copy a chunk's blocks into one buffer
and hand it to the background writer, which gives it back after encoding.

Invariants: a buffer is leased to one user at a time; a buffer given back with an event (the
last asynchronous copy that touches it) is not leased again before that event completes; the
pool allocates only when no free buffer big enough has finished its last copy (so packing the
next group overlaps the copy of the last), never beyond `capacity` bytes, and counts every
allocation (`allocs`), so steady traffic shows zero new allocations once warm.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Sequence

import torch

ALIGN = 64  # every packed part starts here: any dtype view of it is aligned
MIN_BUFFER = 1 << 20


def packed_offsets(nbytes: Sequence[int]) -> tuple[list[int], int]:
    """Start of each part when packed one after another at ALIGN boundaries, and the total size."""
    offsets, end = [], 0
    for n in nbytes:
        offsets.append(end)
        end += -(-n // ALIGN) * ALIGN
    return offsets, end


def groups_of(sizes: Sequence[int], limit: int) -> list[list[int]]:
    """Indices of `sizes` in runs, in order, each run's sum at most `limit` unless one item alone
    exceeds it. Invariant: every index appears once, in order; no run is empty."""
    runs: list[list[int]] = []
    total = 0
    for i, n in enumerate(sizes):
        if not runs or (runs[-1] and total + n > limit):
            runs.append([])
            total = 0
        runs[-1].append(i)
        total += n
    return runs


@dataclass
class Lease:
    """One buffer of the pool, `nbytes` of it in use, until `release`."""

    pool: "StagingPool"
    buffer: torch.Tensor  # uint8, the whole buffer
    nbytes: int

    @property
    def host(self) -> torch.Tensor:
        return self.buffer[: self.nbytes]

    def view(self, offset: int, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        n = int(torch.Size(shape).numel()) * dtype.itemsize
        return self.buffer[offset : offset + n].view(dtype).view(*shape)

    def release(self, event: Any = None) -> None:
        """Back to the pool; `event` (a CUDA event) marks the last copy that reads or writes it."""
        self.pool._give_back(self.buffer, event)


class StagingPool:
    def __init__(self, capacity: int, pinned: bool) -> None:
        self.capacity, self.pinned = capacity, pinned
        self._free: list[tuple[torch.Tensor, Any]] = []  # (buffer, event of its last copy)
        self._lock = threading.Lock()
        self.allocated = 0  # bytes held, leased or free
        self.allocs = 0  # buffers allocated since the pool was made

    def lease(self, nbytes: int) -> Lease | None:
        """A buffer of at least `nbytes`, or None when the pool is at capacity and none is free
        (the caller then copies without staging: slower, never wrong)."""
        with self._lock:
            fits = [i for i, (b, _) in enumerate(self._free) if b.numel() >= nbytes]
            ready = [i for i in fits if self._free[i][1] is None or self._free[i][1].query()]
            size = max(MIN_BUFFER, 1 << max(0, nbytes - 1).bit_length())
            if ready or (fits and self.allocated + size > self.capacity):
                # a buffer whose last copy is done; else, at capacity, one still in flight (waited on below)
                buf, event = self._free.pop(min(ready or fits, key=lambda i: self._free[i][0].numel()))
            else:  # none free, or all still in flight with room for one more: double-buffer
                while self._free and self.allocated + size > self.capacity:  # make room: drop small ones
                    dropped, _ = self._free.pop(0)
                    self.allocated -= dropped.numel()
                if self.allocated + size > self.capacity:
                    return None
                buf, event = torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned), None
                self.allocated += size
                self.allocs += 1
        if event is not None:
            event.synchronize()
        return Lease(self, buf, nbytes)

    def _give_back(self, buffer: torch.Tensor, event: Any) -> None:
        with self._lock:
            self._free.append((buffer, event))
            self._free.sort(key=lambda be: be[0].numel())
