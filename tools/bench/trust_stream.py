"""The query stream of `kvgate bench trust`, built from a labelled pairs file (pure functions).

Duplicate labels join questions into equivalence classes (union-find; a pair labelled 0 joins
nothing); each class gets one canonical answer; the stream is every distinct question once, in a
seeded shuffle. A hit is right when it serves the answer of the query's own class.

Slices (the rule that keeps tuning data apart from reported data): the pairs file's usable rows
are numbered from 0; rows with an even number form the tuning slice, odd ones the reported slice,
less the odd rows that share a question with an even one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

from kvgate.tools.tuning.pairs import Pair

SLICES = ("reported", "tuning", "all")


@dataclass(frozen=True)
class Stream:
    questions: tuple[str, ...]  # in replay order
    answer_of: dict[str, str]  # question → its class's canonical answer
    classes: int


def slice_pairs(pairs: Sequence[Pair], which: str) -> list[Pair]:
    """The rows of a slice: even row numbers = tuning, odd = reported (less any odd row sharing a
    question with an even one), or all of them.

    Invariant: no normalised question (kvgate.tools.tuning.split.normalise) is in both the tuning and the
    reported slice, so nothing chosen on the tuning slice has seen a reported question."""
    if which == "all":
        return list(pairs)
    tuning = [p for i, p in enumerate(pairs) if i % 2 == 0]
    if which == "tuning":
        return tuning
    from kvgate.tools.tuning.split import normalise

    seen = {normalise(q) for p in tuning for q in (p.question1, p.question2)}
    return [
        p
        for i, p in enumerate(pairs)
        if i % 2 == 1 and normalise(p.question1) not in seen and normalise(p.question2) not in seen
    ]


def classes_of(pairs: Sequence[Pair]) -> dict[str, str]:
    """Each question's class representative (union-find with path halving over duplicate pairs).

    Invariant: two questions share a representative iff a chain of duplicate-labelled pairs
    links them; a pair labelled 0 never joins its questions."""
    parent: dict[str, str] = {}

    def find(q: str) -> str:
        parent.setdefault(q, q)
        while parent[q] != q:
            parent[q] = parent[parent[q]]
            q = parent[q]
        return q

    for pair in pairs:
        a, b = find(pair.question1), find(pair.question2)
        if pair.duplicate and a != b:
            parent[max(a, b)] = min(a, b)  # deterministic representative
    return {q: find(q) for q in list(parent)}


def build_stream(pairs: Sequence[Pair], seed: int) -> Stream:
    """Every distinct question once, shuffled with `seed`; answers name the class."""
    rep = classes_of(pairs)
    numbers = {r: i for i, r in enumerate(sorted(set(rep.values())))}
    answer_of = {q: f"Canonical answer #{numbers[r]}: {r}" for q, r in rep.items()}
    questions = sorted(rep)
    random.Random(seed).shuffle(questions)
    return Stream(tuple(questions), answer_of, len(numbers))
