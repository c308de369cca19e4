"""The pure decision rule of semantic.max_error_rate (index/trust.py) and the bench's stream
(tools/bench/trust_stream.py): unit and property tests."""
from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from index.trust import (
    Observation, budget_cutoff, error_upper, fit_rule, normalise_answer, vetoed, wilson_upper, within_budget,
)
from tools.bench.trust_stream import build_stream, classes_of, slice_pairs
from tools.tuning.pairs import Pair

observations = st.lists(st.builds(Observation, st.floats(0.0, 1.0), st.booleans()), max_size=60)


@settings(max_examples=60, deadline=None)
@given(observations, st.floats(0.0, 1.0))
def test_fit_is_finite_and_bound_is_above_the_estimate(obs, s):
    rule = fit_rule(obs)
    assert all(math.isfinite(c) for c in rule.coef)
    assert rule.cov[0][0] > 0 and rule.cov[1][1] > 0
    point = error_upper(rule, s, z=0.0)
    bound = error_upper(rule, s)
    assert 0.0 < point <= bound < 1.0 or point == bound  # saturates only at the float limits
    assert error_upper(rule, s, z=3.0) >= bound


def test_no_data_is_never_confident_and_much_data_learns_the_threshold():
    assert error_upper(fit_rule([]), 0.99) > 0.5
    rng = random.Random(0)
    sims = [rng.uniform(0.6, 1.0) for _ in range(2000)]
    obs = [Observation(s, s > 0.9) for s in sims]  # separable: correct exactly above 0.9
    rule = fit_rule(obs)
    assert 0.87 < rule.threshold < 0.93
    assert error_upper(rule, 0.99) < 0.02  # far above the threshold: confidently right
    assert error_upper(rule, 0.8) > 0.9  # far below: confidently wrong
    assert error_upper(fit_rule(obs[:20]), 0.99) > error_upper(rule, 0.99)  # less data, wider bound


def test_veto_needs_a_wrong_verdict_at_least_as_close():
    own = [Observation(0.95, False), Observation(0.97, True)]
    assert vetoed(own, 0.94) and vetoed(own, 0.95)
    assert not vetoed(own, 0.96)
    assert not vetoed([], 0.5)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), max_size=50), st.floats(0.001, 0.5), st.integers(0, 200))
def test_budget_cutoff_spends_at_most_delta_per_lookup(bounds, delta, extra):
    lookups = len(bounds) + extra
    cutoff = budget_cutoff(bounds, delta, lookups)
    assert cutoff >= delta
    if cutoff > delta:
        assert sum(b for b in bounds if b <= cutoff) <= delta * lookups + 1e-9
    assert budget_cutoff(bounds, min(0.99, delta * 2), lookups) >= cutoff  # monotone in δ


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=200), st.floats(0.001, 0.5))
def test_ledger_keeps_spent_within_delta_at_every_moment(bounds, delta):
    spent = 0.0
    for lookups, bound in enumerate(bounds, start=1):
        if within_budget(spent, bound, delta, lookups):
            spent += bound
        assert spent <= delta * lookups + 1e-9


@given(st.integers(0, 500), st.integers(0, 500))
def test_wilson_upper_covers_the_observed_rate(errors, extra):
    n = errors + extra
    high = wilson_upper(errors, n)
    assert high <= 1.0 and (n == 0 or high >= errors / n)


def test_normalised_answers_ignore_case_and_spacing():
    assert normalise_answer("  Paris\n is the  CAPITAL ") == normalise_answer("paris is the capital")
    assert normalise_answer("Paris.") != normalise_answer("Lyon.")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12), st.booleans()), max_size=30))
def test_classes_are_the_components_of_duplicate_pairs(rows):
    pairs = [Pair(f"q{a}", f"q{b}", dup) for a, b, dup in rows]
    rep = classes_of(pairs)
    # naive components over the duplicate edges
    comp = {q: {q} for q in rep}
    for p in pairs:
        if p.duplicate:
            merged = comp[p.question1] | comp[p.question2]
            for q in merged:
                comp[q] = merged
    for a in rep:
        for b in rep:
            assert (rep[a] == rep[b]) == (b in comp[a])


def test_stream_is_seeded_and_slices_are_disjoint():
    pairs = [Pair(f"a{i}", f"b{i}", i % 3 == 0) for i in range(20)]
    assert build_stream(pairs, 1) == build_stream(pairs, 1)
    assert build_stream(pairs, 1).questions != build_stream(pairs, 2).questions
    tuning, reported = slice_pairs(pairs, "tuning"), slice_pairs(pairs, "reported")
    assert not set(tuning) & set(reported) and len(tuning) + len(reported) == len(pairs)
    stream = build_stream(pairs, 0)
    assert stream.classes == 20 + 20 - 7  # 7 duplicate pairs each join two questions
    assert stream.answer_of["a0"] == stream.answer_of["b0"] and stream.answer_of["a1"] != stream.answer_of["b1"]
