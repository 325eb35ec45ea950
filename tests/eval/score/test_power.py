"""Variance components and the minimum detectable difference: by hand, and by simulation with
our own paired test (the sign-flip permutation test the reports use) on scores drawn from known
components."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cts.eval.score.metrics import paired_tests, smallest_p
from cts.eval.score.power import (
    ComponentIntervals,
    DifferenceNoise,
    NonFiniteNoise,
    can_reject,
    component_cis,
    components,
    difference_noise,
    fewest_instances,
    instances_needed,
    mde,
    mde_normal,
    paired_mde,
    plan,
    power,
)


def test_components_by_hand():
    # Instance means 2, 6, 10 (variance 16); within: (1 + 1 + 1 + 1 + 0 + 0) / 3 = 4/3.
    found = components({"a": [1, 3], "b": [5, 7], "c": [10, 10]})
    assert found.instances == 3 and found.seeds == 2
    assert found.within == pytest.approx(4 / 3)
    assert found.between == pytest.approx(16 - (4 / 3) / 2)  # less the seeds' part of it
    assert found.seed_share == pytest.approx((4 / 3) / (16 - 2 / 3 + 4 / 3))
    assert found.icc == pytest.approx(1 - found.seed_share)
    one_seed = components({"a": [1], "b": [5]})
    assert one_seed.within is None and one_seed.seed_share is None and one_seed.between == 8
    with pytest.raises(ValueError):
        components({"a": [1, 2]})


def test_difference_noise_by_hand():
    a = {"x": [10, 12], "y": [20, 20], "z": [0, 2]}
    b = {"x": [5, 5], "y": [10, 14], "z": [0, 0], "only-b": [3, 3]}
    noise = difference_noise(a, b)
    # D = 6, 8, 1 (mean 5, variance 13); within a = (1+1+0+0+1+1)/3 = 4/3, b = (0+0+4+4+0+0)/3.
    assert noise.instances == 3 and noise.variance == pytest.approx(13)
    assert noise.seed_part == pytest.approx((4 / 3 + 8 / 3) / 2)
    assert noise.interaction == pytest.approx(13 - 2)
    assert noise.at(4) == pytest.approx(11 + 1)  # the seeds' part halves with twice the seeds


def test_difference_noise_with_unequal_seed_counts_by_hand():
    """a has 2 seeds, b 4: each side's seed-mean carries within / its own seed count."""
    a = {"x": [10, 14], "y": [20, 20], "z": [0, 2]}
    b = {"x": [5, 5, 5, 5], "y": [10, 14, 10, 14], "z": [0, 0, 0, 0]}
    noise = difference_noise(a, b)
    # within a = (4 + 4 + 0 + 0 + 1 + 1) / 3 = 10/3; within b = (4 · 4) / 9 = 16/9.
    # D = 12 − 5, 20 − 12, 1 − 0 = 7, 8, 1: mean 16/3, variance (25 + 64 + 169) / 9 / 2 = 43/3.
    assert noise.variance == pytest.approx(43 / 3)
    assert noise.seed_part == pytest.approx((10 / 3) / 2 + (16 / 9) / 4)  # 19/9, not 46/24
    assert noise.interaction == pytest.approx(43 / 3 - 19 / 9)
    # The seeds the parts stand on: (10/3 + 16/9) / (19/9) = 46/19; at 4 seeds a side the
    # seeds' part is (10/3 + 16/9) / 4 = 23/18.
    assert noise.seeds == pytest.approx(46 / 19)
    assert noise.at(4) == pytest.approx(110 / 9 + 23 / 18)


def test_mde_against_the_closed_form_and_the_power_it_gives():
    assert power(mde(100.0, 30), 100.0, 30) == pytest.approx(0.8, abs=1e-6)
    # By hand, the t approximation (t_.975,9 + t_.8,9) · sd / √n = (2.262 + 0.883) · √10 = 9.95,
    # and the normal one (1.960 + 0.842) · √10 = 8.86: at 10 instances the textbook formula is
    # 12% too optimistic; at 200 (t ≈ z) they agree within 1%.
    assert mde(100.0, 10) == pytest.approx(9.95, rel=0.01)
    assert mde_normal(100.0, 10) == pytest.approx(8.86, rel=0.01)
    assert mde(100.0, 200) / mde_normal(100.0, 200) == pytest.approx(1.0, abs=0.01)
    assert mde(0.0, 10) is None and mde(5.0, 1) is None


def simulated(
    rng: np.random.Generator,
    *,
    runs: int,
    n: int,
    seeds: int,
    delta: float,
    sd: tuple[float, float, float],
) -> list[tuple[list[float], list[float]]]:
    """`runs` paired comparisons of two systems: per instance a shared difficulty (sd[0]),
    the true difference delta plus an instance-by-system interaction (sd[1]), and per seed of
    each system its own noise (sd[2]); each side scored as its mean over seeds."""
    difficulty = rng.normal(0, sd[0], (runs, n, 1))
    interaction = rng.normal(0, sd[1], (runs, n, 1))
    a = 50 + difficulty + delta + interaction + rng.normal(0, sd[2], (runs, n, seeds))
    b = 50 + difficulty + rng.normal(0, sd[2], (runs, n, seeds))
    return [(list(x.mean(axis=1)), list(y.mean(axis=1))) for x, y in zip(a, b, strict=True)]


def rejected(pairs: list[tuple[list[float], list[float]]], alpha: float = 0.05) -> float:
    """The share of runs our paired test rejects at alpha."""
    tests = paired_tests(pairs, resamples=2000, seed=1)
    return sum(t.p_value <= alpha for t in tests) / len(tests)


#: Known components: instance difficulty 15, interaction 6, a seed's noise 12 (points of sd).
SD = (15.0, 6.0, 12.0)


def noise_of(seeds: int) -> DifferenceNoise:
    """The true noise of a comparison with these components at `seeds` seeds."""
    seed_part = 2 * SD[2] ** 2 / seeds
    return DifferenceNoise(1, seeds, SD[1] ** 2 + seed_part, seed_part, SD[1] ** 2)


def test_the_suggested_plan_has_the_power_it_promises_under_our_own_test():
    """`plan` to detect 5 points: its cheapest plan, simulated 600 times with a true
    difference of 5, is rejected by the sign-flip test 0.8 ± 0.05 of the time; the plan with 3
    seeds too (this fails when `at` does not scale the seeds' part, or components drop it)."""
    rng = np.random.default_rng(7)
    plans = plan(noise_of(1), 5.0, max_instances=500, max_seeds=4)
    by_seeds = {p.seeds: p for p in plans.plans}
    assert set(by_seeds) == {1, 2, 3, 4}
    assert by_seeds[1].instances > by_seeds[3].instances  # seeds are 80% of Var(D) at 1 seed
    for chosen in (plans.plans[0], by_seeds[3]):
        pairs = simulated(rng, runs=600, n=chosen.instances, seeds=chosen.seeds, delta=5.0, sd=SD)
        assert rejected(pairs) == pytest.approx(0.8, abs=0.05), chosen


def test_the_mde_is_the_simulated_80_percent_power_difference_within_ten_percent():
    """At 40 instances and 2 seeds the sign-flip test rejects a true difference of 0.9 × MDE
    less than 80% of the time and one of 1.1 × MDE more: the MDE is within 10% of the
    difference it detects 80% of the time. A difference of 0 is rejected at α."""
    rng = np.random.default_rng(11)
    n, seeds = 40, 2
    detectable = mde(noise_of(seeds).variance, n)
    assert detectable is not None
    below = rejected(simulated(rng, runs=800, n=n, seeds=seeds, delta=0.9 * detectable, sd=SD))
    above = rejected(simulated(rng, runs=800, n=n, seeds=seeds, delta=1.1 * detectable, sd=SD))
    null = rejected(simulated(rng, runs=800, n=n, seeds=seeds, delta=0.0, sd=SD))
    assert below < 0.8 < above, (below, above)
    assert null == pytest.approx(0.05, abs=0.025)


def test_components_recover_the_variances_they_were_drawn_from():
    rng = np.random.default_rng(3)
    n, seeds, between, within = 3000, 4, 15.0**2, 12.0**2
    table = rng.normal(0, math.sqrt(between), (n, 1)) + rng.normal(0, math.sqrt(within), (n, seeds))
    found = components({str(i): list(row) for i, row in enumerate(table)})
    assert found.between == pytest.approx(between, rel=0.1)
    assert found.within == pytest.approx(within, rel=0.05)
    pairs = simulated(rng, runs=1, n=3000, seeds=seeds, delta=0.0, sd=SD)
    assert len(pairs[0][0]) == 3000


def test_plans_say_when_seeds_cannot_help_and_when_the_dataset_is_too_small():
    flat = DifferenceNoise(30, 2, 100.0, 2.0, 98.0)  # seeds are 2% of the variance
    found = plan(flat, 5.0, max_instances=500)
    assert any("more seeds cannot help" in note for note in found.notes)
    assert found.instances_at_any_seeds is not None
    assert found.plans[0].seeds == 1  # more seeds only cost keys
    small = plan(flat, 1.0, max_instances=50)
    assert small.plans == [] and any("cannot detect 1 points" in note for note in small.notes)
    flat_zero = plan(DifferenceNoise(6, 2, 0.0, 0.0, 0.0), 5.0, max_instances=500)
    assert flat_zero.plans == [] and "do not vary" in flat_zero.notes[0]
    one_seed = plan(DifferenceNoise(30, 1, 100.0, None, None), 5.0, max_instances=500)
    assert [p.seeds for p in one_seed.plans] == [1] and "one seed" in one_seed.notes[0]


def test_paired_mde_is_the_noncentral_t_mde_of_the_differences_variance():
    # Differences 1, 3, 8, 2, 6, 4: mean 4, variance (9 + 1 + 16 + 4 + 4 + 0) / 5 = 6.8 on n = 6
    # (df 5). The 80%-power difference of the two-sided t test at α = 0.05, solved here from
    # scipy's noncentral t.
    from scipy import optimize, stats

    critical = stats.t.ppf(0.975, 5)

    def power_at(d: float) -> float:
        shift = d / math.sqrt(6.8 / 6)
        return stats.nct.sf(critical, 5, shift) + stats.nct.cdf(-critical, 5, shift)

    # 3.5 points have power 0.748 there, 4 have 0.848.
    by_hand = optimize.brentq(lambda d: power_at(d) - 0.8, 2, 6)
    assert 3.5 < by_hand < 4
    differences = [1, 3, 8, 2, 6, 4]
    assert paired_mde(differences) == pytest.approx(by_hand, rel=1e-6)
    assert paired_mde(differences) == pytest.approx(mde(6.8, 6))
    assert paired_mde(differences[::-1], alpha=0.05 / 2) == pytest.approx(mde(6.8, 6, 0.05 / 2))
    # No variance, or one instance: nothing to scale a detectable difference by.
    assert paired_mde([5, 5, 5]) is None and paired_mde([4]) is None and paired_mde([]) is None
    # Three instances: the sign-flip test's p is at least 2/2^3 = 0.25, it cannot reject.
    assert paired_mde([1, 3, 8]) is None


def test_the_smallest_p_of_the_sign_flip_test_by_hand():
    """Enumerated (2^n ≤ resamples): the identity and the all-flipped signs are always as
    extreme as observed, so p ≥ 2/2^n, reached when every difference has one sign. Sampled:
    p = (b + 1)/(B + 1) ≥ 1/(B + 1), reached when no sampled flip is as extreme."""
    assert smallest_p(5) == 1 / 16 and smallest_p(6) == 1 / 32 and smallest_p(13) == 2 / 8192
    assert smallest_p(14) == 1 / 10_001 and smallest_p(30, resamples=100) == 1 / 101
    assert smallest_p(0) == 1.0
    (six,) = paired_tests([([1.0, 2, 3, 4, 5, 6], [0.0] * 6)])
    assert six.p_value == 1 / 32
    # 14 instances, 100 sampled flips: each is the identity or all-flipped with chance
    # 2/16384, and the seed's 100 draws hold neither.
    (sampled,) = paired_tests([([1.0] * 14, [0.0] * 14)], resamples=100)
    assert sampled.p_value == smallest_p(14, resamples=100)


def test_no_mde_where_the_sign_flip_test_cannot_reject():
    """At α = 0.05: 2/2^5 = 0.0625 > α, 2/2^6 = 0.03125 ≤ α. On a Holm row of three at α/3 =
    0.0167: 2/2^6 > α/3, 2/2^7 = 0.0156 ≤ α/3."""
    assert mde(100.0, 5) is None and mde(100.0, 6) == pytest.approx(14.35, abs=0.01)
    assert mde(100.0, 6, 0.05 / 3) is None and mde(100.0, 7, 0.05 / 3) is not None
    assert (fewest_instances(0.05), fewest_instances(0.05 / 3)) == (6, 7)
    assert not can_reject(5, 0.05) and can_reject(6, 0.05) and not can_reject(6, 0.05 / 3)
    # Below 1/(10000 + 1), the smallest sampled p, no number of instances can reject.
    assert fewest_instances(0.5 / 10_001) is None and mde(100.0, 500, 0.5 / 10_001) is None


def test_a_plan_never_asks_for_fewer_instances_than_the_test_can_reject_on():
    """Detecting 30 points with Var(D) 100 (sd 10): the t test's MDE is 25.2 at 4 instances
    (1 seed: variance 60 + 40 · 2 = 140), but the sign-flip test cannot reject below 6."""
    noise = DifferenceNoise(10, 2.0, 100.0, 40.0, 60.0)
    found = plan(noise, 30.0, max_instances=518)
    assert [(p.instances, p.seeds) for p in found.plans] == [(6, 1)]
    assert found.instances_at_any_seeds == 6
    assert any("no plan has fewer than 6 instances" in note for note in found.notes)
    assert instances_needed(100.0, 30.0, 518, 0.05, 0.8) == 6
    assert instances_needed(100.0, 30.0, 518, 0.05 / 3, 0.8) == 7
    assert instances_needed(0.0, 30.0, 518, 0.05, 0.8) == 6  # no noise: the bound alone
    assert plan(noise, 30.0, max_instances=5).plans == []


def test_a_non_finite_variance_is_refused_before_any_search(monkeypatch: pytest.MonkeyPatch):
    """A NaN or infinite variance never raises power to 80%: the search for the MDE must not
    start (counted, not timed: `power` is never called)."""
    import cts.eval.score.power as module

    calls: list[float] = []

    def counted(difference: float, variance: float, n: int, alpha: float = 0.05) -> float:
        calls.append(variance)
        if len(calls) > 100:
            raise AssertionError("mde searched a non-finite variance")
        return power(difference, variance, n, alpha)

    monkeypatch.setattr(module, "power", counted)
    for variance in (math.nan, math.inf):
        with pytest.raises(NonFiniteNoise, match="not finite"):
            mde(variance, 10)
    with pytest.raises(NonFiniteNoise, match="1 of 3 differences are NaN or infinite"):
        paired_mde([1.0, math.nan, 3.0])
    assert calls == []


def test_component_cis_by_hand_on_two_instances():
    """Instances (0, 2) and (10, 16): squares about their means 2 and 18, means 1 and 13.
    Point: within (2 + 18) / 2 = 10, between 72 − 10 / 2 = 67. A resample of the two draws
    a a or b b (a quarter of resamples each: within 2 or 18, no between, the share 1) or one
    of each (the point estimate): the 2.5% and 97.5% percentiles are those extremes."""
    table = np.array([[0.0, 2.0], [10.0, 16.0]])
    point = components({"a": [0, 2], "b": [10, 16]})
    assert (point.within, point.between) == pytest.approx((10, 67))
    found = component_cis(table)
    assert (found.instances, found.resamples) == (2, 2000)
    assert found.within == pytest.approx((2, 18))
    assert found.between == pytest.approx((0, 67))
    assert found.seed_share == pytest.approx((10 / 77, 1))
    assert found.as_dict() == pytest.approx(
        {
            "between_low": 0,
            "between_high": 67,
            "within_low": 2,
            "within_high": 18,
            "seed_share_low": 10 / 77,
            "seed_share_high": 1,
        }
    )


def test_component_cis_bracket_the_estimate_and_repeat_with_their_seed():
    rng = np.random.default_rng(7)
    table = rng.normal(0, 15, (40, 1)) + rng.normal(0, 8, (40, 3))
    point = components({str(i): list(row) for i, row in enumerate(table)})
    found = component_cis(table, seed=1)
    assert point.within is not None and found.within and found.between and found.seed_share
    assert found.between[0] < point.between < found.between[1]
    assert found.within[0] < point.within < found.within[1]
    assert point.seed_share is not None
    assert found.seed_share[0] < point.seed_share < found.seed_share[1]
    assert component_cis(table, seed=1) == found
    assert component_cis(table, seed=2) != found
    # One seed: between has an interval, within and the share cannot.
    one = component_cis(table[:, :1])
    assert one.between is not None and one.within is None and one.seed_share is None
    assert one.as_dict()["within_low"] is None
    # Under two instances, nothing to resample.
    assert component_cis(table[:1]) == ComponentIntervals(1, 2000, None, None, None)
    with pytest.raises(ValueError):
        component_cis(table[0])


def test_component_cis_are_degenerate_when_every_instance_is_the_same():
    # Every instance scores 3 and 5: within (1 + 1) / 1 = 2 in every resample, no between.
    found = component_cis(np.tile([3.0, 5.0], (6, 1)))
    assert found.between == (0.0, 0.0)
    assert found.within == (2.0, 2.0)
    assert found.seed_share == (1.0, 1.0)
    # Nothing varies at all: the share is undefined (0 / 0), the variances are [0, 0].
    flat = component_cis(np.full((5, 2), 4.0))
    assert (flat.between, flat.within, flat.seed_share) == ((0.0, 0.0), (0.0, 0.0), None)


def test_seeds_shared_by_both_sides_are_paired_by_hand():
    """Seed s seeds both conditions of a key: their seed noise moves together. Both sides'
    scores off by the same amount per seed: the per-seed differences never change, so the
    seeds add nothing to the difference's noise (as if independent: 2 · within / k)."""
    a = {"x": [11, 13], "y": [20, 22], "z": [1, 3]}
    b = {"x": [1, 3], "y": [15, 17], "z": [0, 2]}
    noise = difference_noise(a, b)
    # D = 10, 5, 1: variance 20.33…; per-seed differences 10, 10; 5, 5; 1, 1: within 0.
    assert noise.variance == pytest.approx(61 / 3)
    assert noise.seed_part == pytest.approx(0.0) and noise.interaction == pytest.approx(61 / 3)
    assert noise.at(8) == pytest.approx(noise.variance)


def test_a_plan_at_its_holm_familys_level_has_the_power_it_promises():
    """The report reads a pair's clarify@k rows as one Holm family: with three, a row must
    clear α/3 to be rejected first. Planned at α = 0.05 (variance 180, D 5: 59 instances) the
    MDE at α/3 is 5.80 points, power ≈ 0.65; planned at α/3 (79 instances), 600 simulated
    sweeps reject at α/3 with our own sign-flip test 0.8 ± 0.05 of the time."""
    variance = 180.0
    at_alpha = instances_needed(variance, 5.0, 10_000, 0.05, 0.8)
    assert at_alpha == 59
    assert mde(variance, 59, 0.05 / 3) == pytest.approx(5.80, abs=0.01)
    assert power(5.0, variance, 59, 0.05 / 3) == pytest.approx(0.65, abs=0.02)
    family = instances_needed(variance, 5.0, 10_000, 0.05 / 3, 0.8)
    assert family == 79
    rng = np.random.default_rng(11)
    d = rng.normal(5.0, math.sqrt(variance), (600, family))
    pairs = [(list(row), [0.0] * family) for row in d]
    assert rejected(pairs, alpha=0.05 / 3) == pytest.approx(0.8, abs=0.05)


def test_a_plan_from_correlated_seeds_keeps_its_power():
    """Both sides share their seed's noise (correlation 0.7): read as independent, the seeds'
    part was overstated and plans with more seeds promised power they lacked (mean 0.73). Read
    off the per-seed differences, the plan at 4 seeds, simulated 600 times, rejects 0.8 ± 0.05
    of the time."""
    rng = np.random.default_rng(5)
    rho, seed_sd, interaction_sd, n_pilot = 0.7, 12.0, 6.0, 400

    def draw(runs: int, n: int, seeds: int, delta: float) -> tuple[np.ndarray, np.ndarray]:
        shared = rng.normal(0, seed_sd, (runs, n, seeds))
        own_a = rng.normal(0, seed_sd, (runs, n, seeds))
        own_b = rng.normal(0, seed_sd, (runs, n, seeds))
        base = rng.normal(50, 15, (runs, n, 1))
        inter = rng.normal(0, interaction_sd, (runs, n, 1))
        mix = lambda own: math.sqrt(rho) * shared + math.sqrt(1 - rho) * own  # noqa: E731
        return base + delta + inter + mix(own_a), base + mix(own_b)

    a, b = draw(1, n_pilot, 2, 0.0)
    pilot = difference_noise(
        {str(i): list(a[0, i]) for i in range(n_pilot)},
        {str(i): list(b[0, i]) for i in range(n_pilot)},
    )
    # True: seeds' part at 2 seeds 2 · (1 − ρ) · 144 / 2 = 43.2; interaction 36.
    assert pilot.seed_part == pytest.approx(43.2, rel=0.15)
    chosen = {p.seeds: p for p in plan(pilot, 5.0, max_instances=2000, max_seeds=4).plans}[4]
    a, b = draw(600, chosen.instances, 4, 5.0)
    pairs = [(list(x.mean(axis=1)), list(y.mean(axis=1))) for x, y in zip(a, b, strict=True)]
    assert rejected(pairs) == pytest.approx(0.8, abs=0.05)
