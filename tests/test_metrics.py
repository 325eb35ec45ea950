"""Scoring formulas against hand computations."""

from __future__ import annotations

import random

import pytest

from eval.metrics import bootstrap_ci, gain_recovered, paired_test, restore_score

WEIGHTS = {"n1": 3.0, "n2": 2.0, "n3": 1.0}
LABELS = {"n1": "full", "n2": "partial", "n3": "none"}


def test_weighted_restore_score():
    # 100 · (3·1 + 2·0.5 + 1·0) / 6 = 66.67
    assert restore_score(LABELS, WEIGHTS) == pytest.approx(400 / 6)


def test_strict_restore_score():
    # partial counts 0: 100 · 3 / 6
    assert restore_score(LABELS, WEIGHTS, strict=True) == pytest.approx(50.0)


def test_unweighted_restore_score():
    # 100 · (1 + 0.5 + 0) / 3
    assert restore_score(LABELS, WEIGHTS, weighted=False) == pytest.approx(50.0)


def test_all_full_and_all_none():
    assert restore_score(dict.fromkeys(WEIGHTS, "full"), WEIGHTS) == 100.0
    assert restore_score(dict.fromkeys(WEIGHTS, "none"), WEIGHTS) == 0.0


def test_a_missing_label_is_an_error():
    with pytest.raises(ValueError, match=r"nuggets without a label: \['n3'\]"):
        restore_score({"n1": "full", "n2": "full"}, WEIGHTS)


def test_gain_recovered():
    assert gain_recovered(55.0, 40.0, 70.0) == pytest.approx(0.5)
    assert gain_recovered(40.0, 40.0, 70.0) == 0.0
    assert gain_recovered(30.0, 40.0, 70.0) == pytest.approx(-1 / 3)
    assert gain_recovered(50.0, 60.0, 60.0) is None


def test_bootstrap_ci_contains_the_mean_and_narrows_with_more_instances():
    rng = random.Random(3)
    small = [rng.gauss(50, 20) for _ in range(20)]
    large = small + [rng.gauss(50, 20) for _ in range(380)]
    a, b = bootstrap_ci(small), bootstrap_ci(large)
    assert a.low <= a.mean <= a.high and b.low <= b.mean <= b.high
    assert (b.high - b.low) < (a.high - a.low) / 2
    assert bootstrap_ci([7.0]) == type(a)(7.0, 7.0, 7.0, 1)


def test_paired_test_exact_and_sampled():
    same = paired_test([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert same.mean_difference == 0.0 and same.p_value == 1.0
    # All 6 differences +10: only the two all-same-sign flips are as extreme: p = 2/64.
    clear = paired_test([10.0] * 6, [0.0] * 6)
    assert clear.mean_difference == 10.0 and clear.p_value == pytest.approx(2 / 64)
    rng = random.Random(0)
    a = [rng.gauss(60, 10) for _ in range(100)]
    b = [x - 5 + rng.gauss(0, 3) for x in a]
    result = paired_test(a, b, resamples=2000)
    assert result.p_value < 0.01 and result.low <= 5.0 + 1.5 and result.high >= 5.0 - 1.5
