"""Deterministic, grouped split of labelled pairs into train / calibration / held-out parts.

Invariants:
* deterministic: the part of a pair depends only on the texts of the pairs it is connected to and
  on the seed, never on file order, the machine or a random state;
* grouped: pairs that share a question (after `normalise`) are connected, and a connected group
  lies wholly in one part, so no question is in two parts (a model cannot be scored on a question
  it was trained on, even paired with something else).

A group's part comes from SHA-256(seed ‖ the group's smallest normalised text), mapped to [0, 1).
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal, Sequence

Part = Literal["train", "calib", "holdout"]
PARTS: tuple[Part, ...] = ("train", "calib", "holdout")
DEFAULT_FRACTIONS = (0.6, 0.2, 0.2)  # train, calib, holdout
DEFAULT_SEED = "kvgate-split-v1"

_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """Lower case, whitespace collapsed, trailing punctuation dropped: 'Why?' and 'why' are one question."""
    return _SPACE.sub(" ", text.lower()).strip().rstrip("?!. ")


def _root(parent: dict[str, str], x: str) -> str:
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def group_keys(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """For each pair, the smallest normalised question of its connected group (union-find)."""
    parent: dict[str, str] = {}
    for a, b in pairs:
        na, nb = normalise(a), normalise(b)
        parent.setdefault(na, na)
        parent.setdefault(nb, nb)
        ra, rb = _root(parent, na), _root(parent, nb)
        if ra != rb:  # the smaller text becomes the root, so the root is the group's minimum
            parent[max(ra, rb)] = min(ra, rb)
    return [_root(parent, normalise(a)) for a, _ in pairs]


def unit_hash(key: str, seed: str = DEFAULT_SEED) -> float:
    """A stable number in [0, 1) for `key` (first 8 bytes of SHA-256(seed ‖ 0x00 ‖ key))."""
    digest = hashlib.sha256(seed.encode() + b"\0" + key.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_parts(
    pairs: Sequence[tuple[str, str]],
    fractions: tuple[float, float, float] = DEFAULT_FRACTIONS,
    seed: str = DEFAULT_SEED,
) -> list[Part]:
    """The part of each (question1, question2) pair; see the module docstring for the invariants."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")
    train_end, calib_end = fractions[0], fractions[0] + fractions[1]
    parts: list[Part] = []
    for key in group_keys(pairs):
        u = unit_hash(key, seed)
        parts.append("train" if u < train_end else "calib" if u < calib_end else "holdout")
    return parts


def indices(parts: Sequence[Part], wanted: Part) -> list[int]:
    """Positions whose part is `wanted`, in order."""
    return [i for i, p in enumerate(parts) if p == wanted]
