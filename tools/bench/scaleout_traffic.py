"""The repeat / paraphrase traffic of `kvgate bench scaleout`: QQP duplicate pairs, asked as new
questions, exact repeats and paraphrases, in a seeded order.

Pairs are chosen so that no question of one pair is within `separation` cosine of a question of
another pair (embedded with the real embedder): a hit on another pair's answer can then only
come from a store that serves the wrong entry, never from the semantic threshold, so a wrong
answer is a store fault by construction.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvgate.index.responses.embedder import Embedder

QQP = Path("../shared/data/qqp_dev.csv")  # as the Makefile's PAIRS
FIXED = "[[fixed]] "  # the demo backend answers "Answer: <question>", the same on every call


@dataclass(frozen=True)
class Ask:
    pair: int
    text: str  # with the FIXED marker
    kind: str  # new | repeat | paraphrase


def duplicate_pairs(path: Path, limit: int) -> list[tuple[str, str]]:
    """The first `limit` QQP rows marked duplicate whose questions differ, in file order."""
    out: list[tuple[str, str]] = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            q1, q2 = row["question1"].strip(), row["question2"].strip()
            if row["is_duplicate"] == "1" and q1 and q2 and q1 != q2 and len(q1) < 300 and len(q2) < 300:
                out.append((q1, q2))
                if len(out) >= limit:
                    break
    return out


def separated(pairs: list[tuple[str, str]], embedder: Embedder, separation: float, want: int) -> list[tuple[str, str]]:
    """A greedy subset of `pairs` (at most `want`) in which no two pairs have questions closer than
    `separation` (cosine)."""
    vecs = embedder.embed([FIXED + q for pair in pairs for q in pair]).reshape(len(pairs), 2, -1)
    kept: list[int] = []
    kept_vecs = np.zeros((0, vecs.shape[2]), dtype=np.float32)
    for i in range(len(pairs)):
        if kept and float((kept_vecs @ vecs[i].T).max()) >= separation:
            continue
        kept.append(i)
        kept_vecs = np.concatenate([kept_vecs, vecs[i]])
        if len(kept) >= want:
            break
    return [pairs[i] for i in kept]


def trace(pairs: list[tuple[str, str]], n: int, seed: int, p_new: float = 0.3) -> list[Ask]:
    """n asks: a new pair's first question with probability p_new (while pairs last), otherwise an
    asked pair again, as its first question (exact repeat) or its second (paraphrase), 50/50."""
    rng = random.Random(seed)
    asked: list[int] = []
    out: list[Ask] = []
    for _ in range(n):
        if not asked or (len(asked) < len(pairs) and rng.random() < p_new):
            asked.append(len(asked))
            out.append(Ask(asked[-1], FIXED + pairs[asked[-1]][0], "new"))
            continue
        pair = rng.choice(asked)
        if rng.random() < 0.5:
            out.append(Ask(pair, FIXED + pairs[pair][0], "repeat"))
        else:
            out.append(Ask(pair, FIXED + pairs[pair][1], "paraphrase"))
    return out


def right_answer(text: str, ask: Ask, pairs: list[tuple[str, str]]) -> bool:
    """Whether `text` answers `ask`: the demo backend's fixed answer to one of its pair's questions."""
    return text in {f"Answer: {FIXED}{q}" for q in pairs[ask.pair]}
