"""When does a cached question's answer answer a new question, by the labels of a pairs file?

Scoring only "the pair's own entry, labelled duplicate" as correct counts a hit on an identical
question as wrong: in Quora's pairs the same question recurs across pairs, so a lookup's nearest
entry is often another pair's question1 with the very same text (on the calibration part, many
high-cosine hits go to another pair's entry, most of them the same question word for word). `Equivalence` uses every label in the file instead.
"""

from __future__ import annotations

from typing import Iterable


def normalise(text: str) -> str:
    """Case and whitespace folded: the same question typed twice is one node."""
    return " ".join(text.casefold().split())


class Equivalence:
    """Built from (question1, question2, is_duplicate) rows.

    Invariant: `same(a, b)` is True iff (1) a and b normalise to the same text, or (2) a chain of
    pairs labelled duplicate links them, and in either case (3) no row labels exactly these two
    questions non-duplicate (an explicit label wins over a chain through noisy labels).
    """

    def __init__(self, rows: Iterable[tuple[str, str, bool]]) -> None:
        self._parent: dict[str, str] = {}
        self._negative: set[frozenset[str]] = set()
        for a, b, dup in rows:
            na, nb = normalise(a), normalise(b)
            if dup:
                self._union(na, nb)
            else:
                self._negative.add(frozenset((na, nb)))

    def same(self, a: str, b: str) -> bool:
        na, nb = normalise(a), normalise(b)
        if frozenset((na, nb)) in self._negative and na != nb:
            return False
        return na == nb or self._find(na) == self._find(nb)

    def _find(self, x: str) -> str:
        parent = self._parent
        root = x
        while parent.get(root, root) != root:
            root = parent[root]
        while x != root:  # path compression
            parent[x], x = root, parent.get(x, x)
        return root

    def _union(self, a: str, b: str) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra != rb:
            self._parent[max(ra, rb)] = min(ra, rb)


def credited(
    i: int, served: int, question1: list[str], question2: list[str], duplicate: list[bool], eq: Equivalence
) -> bool:
    """Whether serving pair `served`'s entry (its question1) to pair i's question2 is correct: the
    pair's own entry counts by its own label; another entry by `eq`."""
    if served == i:
        return bool(duplicate[i])
    return eq.same(question1[served], question2[i])
