"""Per-entry similarity floors learned from "that answer was wrong" feedback.

In the spirit of vCache (verified semantic caching): instead of one global threshold, each entry
carries its own minimum similarity, raised where the cache has been shown to be wrong.

A wrong semantic hit at similarity `s` between a query and entry `e` proves that, around `e`, the
embedding puts two questions with different answers only `s` apart. So every entry of that scope
at least as close to `e` as the wrong query was (cos ≥ s) must from now on clear `s + margin`.
That region is remembered as a *mark* (centre = e's vector, similarity = s), so entries stored
there later (including a fresh answer to e's own question) get the same floor.

Invariants:
- floors only rise: `raise_floor(a, b) >= max(a, b)` where both are set;
- a floor never exceeds 1.0 (a floored entry can still be served by the exact tier);
- an entry farther from every mark's centre than that mark's similarity gets no floor from it.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Iterable

import numpy as np

MAX_FLOOR = 1.0


@dataclass(frozen=True)
class Mark:
    """A region of one scope where the embedding was shown to confuse different questions."""

    center: np.ndarray  # unit vector of the wrongly served entry's question
    similarity: float  # similarity of the wrong match
    created: float = 0.0
    tenant: str | None = None  # whose feedback made it (erasing that tenant drops it)


def floor_of(similarity: float, margin: float) -> float:
    """The floor a wrong match at `similarity` imposes: just above it, capped at MAX_FLOOR."""
    return min(MAX_FLOOR, float(similarity) + margin)


def raise_floor(current: float | None, new: float | None) -> float | None:
    """The larger of two floors (None = no floor). Floors never go down."""
    if current is None:
        return new
    if new is None:
        return current
    return max(current, new)


def floor_from_marks(vector: np.ndarray, marks: Iterable[Mark], margin: float) -> float | None:
    """The floor an entry with unit `vector` gets from the marks of its scope (None: none apply)."""
    floor: float | None = None
    for mark in marks:
        if float(np.dot(vector, mark.center)) >= mark.similarity:
            floor = raise_floor(floor, floor_of(mark.similarity, margin))
    return floor


def threshold_for(route_threshold: float, entry_floor: float | None) -> float:
    """Similarity a semantic hit on an entry needs: the route's threshold or the entry's floor."""
    return route_threshold if entry_floor is None else max(route_threshold, entry_floor)


def encode_marks(marks: list[Mark]) -> bytes:
    """JSON (no pickle): vectors as base64 float32."""
    rows = [
        {
            "c": base64.b64encode(np.ascontiguousarray(m.center, dtype=np.float32).tobytes()).decode(),
            "s": m.similarity,
            "t": m.created,
            **({"n": m.tenant} if m.tenant is not None else {}),
        }
        for m in marks
    ]
    return json.dumps(rows, separators=(",", ":")).encode()


def decode_marks(raw: bytes | None, dim: int) -> list[Mark]:
    """Inverse of encode_marks; rows of the wrong dimension are dropped."""
    if not raw:
        return []
    out = []
    for row in json.loads(raw):
        center = np.frombuffer(base64.b64decode(row["c"]), dtype=np.float32)
        if center.shape == (dim,):
            out.append(Mark(center, float(row["s"]), float(row.get("t", 0.0)), row.get("n")))
    return out
