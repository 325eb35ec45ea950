"""Scoring formulas against hand computations."""

from __future__ import annotations

import random

import pytest

from cts.eval.score.metrics import (
    RatioEstimate,
    bootstrap_ci,
    gain_recovered,
    gain_recovered_ci,
    holm,
    paired_difference,
    paired_test,
    restore_score,
)

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


def test_gain_recovered_is_undefined_when_the_oracle_gap_is_negative_or_small():
    # Oracle below blurred: the unguarded formula gives (50 − 60)/(40 − 60) = +0.5, a sign flip.
    assert gain_recovered(50.0, 60.0, 40.0) is None
    # A 0.5-point gap is below the default 1-point minimum; allowed when the caller lowers it.
    assert gain_recovered(60.25, 60.0, 60.5) is None
    assert gain_recovered(60.25, 60.0, 60.5, min_gap=0.5) == pytest.approx(0.5)
    # Exactly the minimum gap is defined: (40.5 − 40)/1 = 0.5 ...
    assert gain_recovered(40.5, 40.0, 41.0) == pytest.approx(0.5)
    # ... also when float noise makes the "1.0" gap 0.9999999999999999.
    assert 1.4 - 0.4 < 1.0
    assert gain_recovered(0.4, 0.4, 1.4) == 0.0
    # min_gap=0 still needs a positive gap.
    assert gain_recovered(50.0, 60.0, 60.0, min_gap=0.0) is None
    with pytest.raises(ValueError):
        gain_recovered(50.0, 40.0, 60.0, min_gap=-1.0)


def test_gain_recovered_ci_is_degenerate_on_identical_instances():
    # Every resample of identical instances has the same means: (55 − 40)/(70 − 40) = 0.5.
    result = gain_recovered_ci([55.0] * 4, [40.0] * 4, [70.0] * 4)
    assert result == RatioEstimate(0.5, 0.5, 0.5, 4, 0.0)


def test_gain_recovered_ci_is_none_when_the_point_estimate_is_undefined():
    # Mean oracle 40 < mean blurred 60: no ratio to put an interval around.
    assert gain_recovered_ci([50.0, 52.0, 48.0], [60.0, 61.0, 59.0], [40.0, 41.0, 39.0]) is None
    # Mean gap 0.5 < min_gap 1.
    assert gain_recovered_ci([60.0, 60.0], [60.0, 60.0], [60.0, 61.0]) is None


def test_gain_recovered_ci_is_unbounded_when_the_gap_is_not_reliably_positive():
    # Two instances with gaps +3 and −1 (mean 1.0, just defined: ratio (1.5 − 0)/1 = 1.5).
    # Resampling both copies of the second (probability 1/4) gives a gap of −1: about 25% of
    # resamples are undefined, far above α/2 = 2.5%, so the interval is unbounded.
    result = gain_recovered_ci([3.0, 0.0], [0.0, 0.0], [3.0, -1.0])
    assert result is not None
    assert result.value == pytest.approx(1.5)
    assert result.low is None and result.high is None
    assert result.n == 2
    assert result.undefined_share == pytest.approx(0.25, abs=0.02)


def test_gain_recovered_ci_places_undefined_resamples_at_both_extremes():
    # Instance 0: s 50, b 40, o 60 (gap 20); instance 1: s 40, b 40, o 30 (gap −10).
    # Resamples: {0, 0} → 10/20 = 0.5 (p 1/4); {0, 1} → (45 − 40)/(45 − 40) = 1.0 (p 1/2);
    # {1, 1} → gap −10, undefined (p 1/4). At level 0.2, α = 0.4: the low bound is the
    # 0.4·B-th of all resamples with the ~0.25·B undefined ones first, i.e. the ~0.15·B-th
    # defined one = 0.5; the high bound the 0.6·B-th with the undefined ones last = 1.0.
    # (Dropping them instead would put the low bound at 0.4 of the defined ones = 1.0.)
    result = gain_recovered_ci([50.0, 40.0], [40.0, 40.0], [60.0, 30.0], level=0.2)
    assert result is not None
    assert result.value == pytest.approx(1.0)
    assert (result.low, result.high) == (0.5, 1.0)
    assert result.undefined_share == pytest.approx(0.25, abs=0.02)


def test_gain_recovered_ci_brackets_a_clear_estimate():
    rng = random.Random(5)
    blurred = [rng.gauss(40, 10) for _ in range(200)]
    oracle = [b + 20 + rng.gauss(0, 5) for b in blurred]
    score = [b + 10 + rng.gauss(0, 5) for b in blurred]
    result = gain_recovered_ci(score, blurred, oracle, resamples=2000)
    assert result is not None and result.undefined_share == 0.0
    assert result.low is not None and result.high is not None
    assert result.low <= result.value <= result.high
    assert result.low <= 0.5 <= result.high
    n = len(score)
    assert result.value == gain_recovered(sum(score) / n, sum(blurred) / n, sum(oracle) / n)


def test_gain_recovered_ci_rejects_unpaired_input():
    with pytest.raises(ValueError):
        gain_recovered_ci([1.0, 2.0], [0.0], [5.0, 5.0])
    with pytest.raises(ValueError):
        gain_recovered_ci([], [], [])


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


def test_sampled_p_value_is_never_zero():
    # n = 100 ⇒ 2^100 flips, so B = 2000 are sampled. All differences +10: a sampled flip is as
    # extreme only if all its signs agree (probability 2^-99), so b = 0 and p = 1/(B + 1).
    result = paired_test([10.0] * 100, [0.0] * 100, resamples=2000)
    assert result.p_value == 1 / 2001


def test_paired_difference_uses_the_common_instances():
    a = {"i1": 5.0, "i2": 7.0, "i3": 1.0}
    b = {"i4": 9.0, "i3": 0.0, "i2": 3.0}
    # Common: i2 (7 − 3 = 4) and i3 (1 − 0 = 1); mean 2.5. Exact flips of (4, 1): means
    # ±2.5, ±1.5, so 2 of 4 are as extreme: p = 0.5.
    result = paired_difference(a, b)
    assert result.n == 2
    assert result.mean_difference == pytest.approx(2.5)
    assert result.p_value == pytest.approx(0.5)
    assert result == paired_test([7.0, 1.0], [3.0, 0.0])
    # Insertion order does not matter: the common ids are sorted.
    assert paired_difference(dict(reversed(a.items())), b) == result
    with pytest.raises(ValueError, match="share no"):
        paired_difference({"x": 1.0}, {"y": 1.0})


def test_holm_hand_computation():
    # Sorted: a 0.01·3 = 0.03; c 0.03·2 = 0.06; b max(0.06, 0.04·1) = 0.06.
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adjusted == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert list(adjusted) == ["a", "b", "c"]
    # Without the running maximum b would read 0.04 < c's 0.06 although its raw p is larger.
    assert holm({"a": 0.001, "b": 0.3, "c": 0.7}) == pytest.approx({"a": 0.003, "b": 0.6, "c": 0.7})


def test_holm_ties_single_and_cap():
    # Ties: 0.02·2 = 0.04, then max(0.04, 0.02·1) = 0.04, in either order.
    assert holm({"x": 0.02, "y": 0.02}) == pytest.approx({"x": 0.04, "y": 0.04})
    assert holm({"only": 0.03}) == {"only": 0.03}
    # 0.4·3 = 1.2 → 1; 0.5·2 = 1.0; max(1, 0.6) = 1.
    assert holm({"a": 0.4, "b": 0.6, "c": 0.5}) == {"a": 1.0, "b": 1.0, "c": 1.0}
    # Partly capped: 0.2·3 = 0.6; 0.6·2 = 1.2 → 1; max(1, 0.7) = 1.
    assert holm({"a": 0.2, "b": 0.6, "c": 0.7}) == pytest.approx({"a": 0.6, "b": 1.0, "c": 1.0})
    assert holm({}) == {}
    with pytest.raises(ValueError):
        holm({"a": 1.5})
    with pytest.raises(ValueError):
        holm({"a": float("nan")})
