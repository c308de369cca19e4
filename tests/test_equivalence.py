"""Scoring a semantic hit by every label in the pairs file (kvgate.tools.tuning.equivalence)."""

from __future__ import annotations

from kvgate.tools.bench.semantic import Pair, TopHit, score
from kvgate.tools.tuning.equivalence import Equivalence, credited

ROWS = [
    ("How can I lose weight quickly?", "What is the fastest way to lose weight?", True),
    ("What is the fastest way to lose weight?", "How do I lose weight fast?", True),
    ("How do I lose weight in a week?", "How do I lose weight in a month?", False),
    ("How can I lose weight quickly?", "How do I lose weight fast?", False),  # noisy label: explicit wins
    ("Which movies are the best in 2016?", "What are your top 5 movies for 2016?", False),
]


def test_same_text_chains_and_explicit_negatives() -> None:
    eq = Equivalence(ROWS)
    assert eq.same("Which movies are  the best in 2016?", "which movies are the best in 2016?")  # same text
    assert eq.same("How can I lose weight quickly?", "What is the fastest way to lose weight?")  # labelled
    assert not eq.same("How can I lose weight quickly?", "How do I lose weight fast?")  # chain, but labelled no
    assert not eq.same("How do I lose weight in a week?", "How do I lose weight in a month?")
    assert not eq.same("How do I lose weight in a week?", "How can I lose weight quickly?")  # unknown: not credited


def test_own_entry_by_its_label_other_entries_by_equivalence() -> None:
    q1, q2, dup = [r[0] for r in ROWS], [r[1] for r in ROWS], [r[2] for r in ROWS]
    eq = Equivalence(ROWS)
    assert credited(0, 0, q1, q2, dup, eq) and not credited(2, 2, q1, q2, dup, eq)
    assert credited(1, 0, q1, q2, dup, eq) is False  # q1[0] vs q2[1]: labelled non-duplicate (row 3)
    assert credited(0, 1, q1, q2, dup, eq)  # q1[1] is q2[0] word for word


def test_score_counts_an_identical_question_from_another_pair() -> None:
    pairs = [
        Pair("What was your biggest mistake?", "What is your biggest regret?", True),
        Pair("What was your biggest mistake?", "Which mistake hurt you most?", False),
        Pair("What is your biggest regret?", "What was your worst regret?", True),
    ]
    # lookup 0 lands on pair 2's entry: the same text as its own question2 -> correct
    top = [TopHit(2, 0.99), TopHit(1, 0.95), TopHit(0, 0.9)]
    out = score(pairs, top, 0.85)
    assert out["hits"] == 3
    # 0: credited (same text); 1: own entry, labelled non-duplicate; 2: "biggest mistake" and "worst
    # regret" are linked through "biggest regret" by two duplicate labels
    assert out["correct_hits"] == 2 and out["precision"] == round(2 / 3, 4) and out["recall"] == 1.0
