"""The pure decision rule of semantic.max_error_rate (index/responses/trust.py) and the bench's stream
(tools/bench/trust_stream.py): unit and property tests."""

from __future__ import annotations

import math
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.index.responses.trust import (
    PRIOR_WEIGHT,
    Observation,
    aggregate_upper,
    allowance,
    budget_cutoff,
    charges,
    error_upper,
    features,
    fit_rule,
    normalise_answer,
    prior_rule,
    vetoed,
    wilson_upper,
    wrong_probabilities,
)
from kvgate.tools.bench.trust_stream import build_stream, classes_of, slice_pairs
from kvgate.tools.tuning.pairs import Pair

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


def test_a_calibration_prior_weighs_a_few_observations_and_yields_to_data():
    rng = random.Random(1)
    calib = fit_rule([Observation(s, s > 0.85) for s in (rng.uniform(0.6, 1.0) for _ in range(2000))])
    record = {"coef": list(calib.coef), "cov": [list(r) for r in calib.cov], "n": calib.n}
    prior = prior_rule(record)
    assert prior is not None and prior.coef == calib.coef
    assert prior.cov[0][0] >= calib.cov[0][0] * calib.n / PRIOR_WEIGHT * 0.999  # widened to PRIOR_WEIGHT observations
    # no observations: the prior itself; it is confident where the flat start is not
    assert fit_rule([], prior=prior).coef == prior.coef
    assert error_upper(fit_rule([], prior=prior), 0.98) < error_upper(fit_rule([]), 0.98)
    # data that disagree (correct only above 0.95) win once there are many of them
    obs = [Observation(s, s > 0.95) for s in (rng.uniform(0.6, 1.0) for _ in range(2000))]
    assert 0.93 < fit_rule(obs, prior=prior).threshold < 0.97
    assert error_upper(fit_rule(obs, prior=prior), 0.9) > 0.9
    for bad in (
        None,
        {},
        {"coef": [1.0], "cov": [[1, 0], [0, 1]], "n": 5},
        {"coef": [1, 2], "cov": [[-1, 0], [0, 1]], "n": 5},
    ):
        assert prior_rule(bad) is None


@settings(max_examples=40, deadline=None)
@given(observations, st.floats(-5, 5), st.floats(-5, 5), st.floats(0.01, 2.0), st.floats(0.0, 1.0))
def test_fit_with_a_prior_is_finite(obs, a, b, var, s):
    prior = prior_rule({"coef": [a, b], "cov": [[var, 0.0], [0.0, var]], "n": 10})
    rule = fit_rule(obs, prior=prior)
    assert all(math.isfinite(c) for c in rule.coef) and rule.cov[0][0] > 0 and rule.cov[1][1] > 0
    assert error_upper(rule, s, z=0.0) <= error_upper(rule, s) + 1e-12


def test_veto_needs_a_wrong_verdict_at_least_as_close():
    own = [Observation(0.95, False), Observation(0.97, True)]
    assert vetoed(own, 0.94) and vetoed(own, 0.95)
    assert not vetoed(own, 0.96)
    assert not vetoed([], 0.5)


def _fitted(obs_sims: list[float]) -> object:
    return fit_rule([Observation(x, x > 0.85) for x in obs_sims])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.6, 1.0), max_size=40),
    st.lists(st.floats(0.6, 1.0), min_size=1, max_size=60),
    st.floats(0.0, 30.0),
)
def test_budget_cutoff_serves_only_what_the_bound_affords(history, sims, budget):
    rule = _fitted(history)
    rows = np.stack([features(x) for x in sims])
    p, grads = charges(rule, rows)
    cutoff = budget_cutoff(p, grads, np.array(rule.cov), budget)
    served = rows[p <= cutoff] if cutoff > 0 else rows[:0]
    assert aggregate_upper(rule, served) <= budget + 1e-9
    assert cutoff == 0.0 or cutoff in set(p.tolist())
    assert budget_cutoff(p, grads, np.array(rule.cov), budget * 2 + 1) >= cutoff  # monotone in the budget


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.6, 1.0), max_size=40), st.lists(st.floats(0.6, 1.0), max_size=60))
def test_aggregate_upper_is_above_the_expected_count_and_grows_with_z(history, sims):
    rule = _fitted(history)
    rows = np.stack([features(x) for x in sims]) if sims else np.zeros((0, 2))
    expected = float(wrong_probabilities(rule, rows).sum())
    bound = aggregate_upper(rule, rows)
    assert expected - 1e-9 <= bound <= aggregate_upper(rule, rows, z=3.0) + 1e-9
    assert (bound == 0.0) == (len(sims) == 0)


def test_the_fits_uncertainty_is_shared_by_every_hit():
    """Many hits of one uncertain curve: the bound grows with their count, not with its root
    (one error of the curve moves them all), so a little data cannot buy many hits."""
    rule = fit_rule([Observation(0.95, True)] * 5 + [Observation(0.7, False)] * 5)
    one = aggregate_upper(rule, features(0.93)[None, :]) - float(wrong_probabilities(rule, features(0.93)[None, :])[0])
    many = np.stack([features(0.93)] * 100)
    margin = aggregate_upper(rule, many) - float(wrong_probabilities(rule, many).sum())
    assert margin > 20 * one


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 100_000), st.floats(0.001, 0.5))
def test_allowance_keeps_the_wilson_bound_at_delta(n, delta):
    m = allowance(n, delta)
    assert 0.0 <= m <= delta * n
    if m > 0:
        assert wilson_upper(m, n) <= delta * (1 + 1e-6) + 1e-12  # wilson_upper takes the count as a float too
    assert allowance(n + 1, delta) >= m - 1e-9 and allowance(n, min(0.5, delta * 1.5)) >= m - 1e-9
    assert allowance(n, delta) == 0.0 or n * delta / (1 - delta) > 1.959963984540054**2 - 1e-9


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
    # rows 0 and 2 tune; row 1 asks a tuning question again (normalised), so it is not reported
    shared = [Pair("a0", "b0", True), Pair("A0 ", "f", True), Pair("x", "y", False), Pair("d", "e", True)]
    assert slice_pairs(shared, "reported") == [Pair("d", "e", True)]
    stream = build_stream(pairs, 0)
    assert stream.classes == 20 + 20 - 7  # 7 duplicate pairs each join two questions
    assert stream.answer_of["a0"] == stream.answer_of["b0"] and stream.answer_of["a1"] != stream.answer_of["b1"]
