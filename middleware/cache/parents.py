"""`semantic.context: semantic`: a follow-up may hit an entry whose earlier user turns are each
judged equivalent to its own (MeanCache's parent links, with kvgate's judge: the embedder's cosine).

The scope of such a route leaves the earlier turns out (system prompts stay in), and each entry
records the earlier user turns it followed (`CacheEntry.parents`). Per lookup, the nearest
PARENT_SEARCH_K entries are read (the same follow-up text, "What famous landmark is there?", may
close many conversations) and those whose parents do not match are dropped before the usual
choice. Assistant turns are not compared: in a replayed conversation they are what the cache or
the backend said, and the user turns carry the conversation's topic. Cost: the query's and the
candidates' parent turns are embedded in one batch per lookup.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import numpy as np

from kvgate.index.responses.entries.base import CacheEntry

PARENT_SEARCH_K = 16
PARENT_THRESHOLD = 0.9  # the parent judge's cosine on routes without a cosine threshold (max_error_rate)
T = TypeVar("T")


def parents_match(query: np.ndarray, entry: np.ndarray, threshold: float) -> bool:
    """Whether two histories are equivalent: as many earlier user turns, and turn i of one at
    cosine ≥ threshold to turn i of the other, for every i (rows are unit vectors).

    Invariants: symmetric; two empty histories match; a history matches itself."""
    if query.shape[0] != entry.shape[0]:
        return False
    return bool(query.shape[0] == 0 or (np.einsum("ij,ij->i", query, entry) >= threshold - 1e-6).all())


def same_parents(
    embed: Callable[[list[str]], np.ndarray],
    parents: Sequence[str],
    found: list[tuple[CacheEntry, T]],
    threshold: float,
) -> list[tuple[CacheEntry, T]]:
    """The candidates of `found` (order kept) whose recorded parents match `parents`."""
    same_length = [(e, s) for e, s in found if e.parents is not None and len(e.parents) == len(parents)]
    if not parents or not same_length:
        return same_length
    texts = sorted({*parents, *(p for e, _ in same_length for p in e.parents or [])})
    vectors = dict(zip(texts, embed(texts)))
    mine = np.stack([vectors[p] for p in parents])
    return [
        (e, s)
        for e, s in same_length
        if parents_match(mine, np.stack([vectors[p] for p in e.parents or []]), threshold)
    ]
