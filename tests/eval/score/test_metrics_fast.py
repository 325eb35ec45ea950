"""The vectorised statistics of cts/eval/score/metrics.py against the pure-Python loops they
replaced (copied below as they were): identical numbers, compared by repr (which tells -0.0 from
0.0, prints NaN as nan and fails on a numpy scalar where a float was), on many seeds and shapes."""

from __future__ import annotations

import functools
import math
import operator
import random
import statistics
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

import cts.eval.score.metrics as metrics
import cts.eval.score.resampling as resampling
from cts.eval.score.metrics import (
    Estimate,
    PairedTest,
    RatioEstimate,
    bootstrap_ci,
    bootstrap_cis,
    gain_recovered,
    gain_recovered_ci,
    mean,
    paired_difference,
    paired_differences,
    paired_test,
    paired_tests,
)

_EPS = 1e-9


# --- The reference: cts/eval/score/metrics.py's loops before vectorisation, unchanged but for
# names. --


def ref_gain_recovered_ci(
    score: Sequence[float],
    blurred: Sequence[float],
    oracle: Sequence[float],
    *,
    min_gap: float = 1.0,
    level: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> RatioEstimate | None:
    n = len(score)
    if n == 0 or len(blurred) != n or len(oracle) != n:
        raise ValueError("paired samples need the same, non-zero length")
    if not 0 < level < 1:
        raise ValueError("level must lie strictly between 0 and 1")
    if resamples < 1:
        raise ValueError("resamples must be at least 1")
    value = gain_recovered(sum(score) / n, sum(blurred) / n, sum(oracle) / n, min_gap)
    if value is None:
        return None
    rng = random.Random(seed)
    indices = range(n)
    ratios: list[float] = []
    undefined = 0
    for _ in range(resamples):
        drawn = rng.choices(indices, k=n)
        mean_s = sum(score[i] for i in drawn) / n
        mean_b = sum(blurred[i] for i in drawn) / n
        mean_o = sum(oracle[i] for i in drawn) / n
        gap = mean_o - mean_b
        if gap <= 0:
            undefined += 1
            continue
        ratios.append((mean_s - mean_b) / gap)
    share = undefined / resamples
    alpha = (1 - level) / 2
    low_pos = max(0, math.floor(alpha * resamples + _EPS))
    high_pos = min(resamples - 1, math.ceil((1 - alpha) * resamples - _EPS) - 1)
    if low_pos < undefined or high_pos >= resamples - undefined:
        return RatioEstimate(value, None, None, n, share)
    ratios.sort()
    return RatioEstimate(value, ratios[low_pos - undefined], ratios[high_pos], n, share)


def ref_bootstrap_ci(
    values: Sequence[float], *, level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> Estimate:
    if not values:
        raise ValueError("no values")
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return Estimate(mean, mean, mean, 1)
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    alpha = (1 - level) / 2
    low = means[max(0, math.floor(alpha * resamples))]
    high = means[min(resamples - 1, math.ceil((1 - alpha) * resamples) - 1)]
    return Estimate(mean, low, high, n)


def ref_paired_test(
    a: Sequence[float], b: Sequence[float], *, resamples: int = 10_000, seed: int = 0
) -> PairedTest:
    if len(a) != len(b) or not a:
        raise ValueError("paired samples need the same, non-zero length")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    observed = abs(sum(diffs) / n)
    exact = 2**n <= resamples
    if exact:
        flips = [[1 - 2 * ((mask >> i) & 1) for i in range(n)] for mask in range(2**n)]
    else:
        rng = random.Random(seed)
        flips = [[rng.choice((-1, 1)) for _ in range(n)] for _ in range(resamples)]
    extreme = sum(
        1
        for signs in flips
        if abs(sum(s * d for s, d in zip(signs, diffs, strict=True)) / n) >= observed - 1e-12
    )
    p_value = extreme / len(flips) if exact else (extreme + 1) / (len(flips) + 1)
    ci = ref_bootstrap_ci(diffs, resamples=resamples, seed=seed)
    return PairedTest(ci.mean, ci.low, ci.high, p_value, n)


def ref_paired_difference(
    a: Mapping[str, float], b: Mapping[str, float], *, resamples: int = 10_000, seed: int = 0
) -> PairedTest:
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError("the two systems share no scored instance")
    return ref_paired_test(
        [a[i] for i in common], [b[i] for i in common], resamples=resamples, seed=seed
    )


def neumaier_sum(values: Sequence[float]) -> float:
    """CPython ≥ 3.12's sum() of floats (Python/bltinmodule.c), line for line: the int start 0
    plus the first item, then Neumaier's compensated loop and its final correction."""
    it = iter(values)
    total = 0 + next(it)
    c = 0.0
    for x in it:
        t = total + x
        if abs(total) >= abs(x):
            c += (total - t) + x
        else:
            c += (x - t) + total
        total = t
    if c and math.isfinite(c):
        total += c
    return total


# --- Inputs -----------------------------------------------------------------------------------


def scores(rng: random.Random, n: int, kind: str) -> list[float]:
    """Scores as the report sees them, and the awkward cases: ties on a coarse grid (partial
    credit gives k/2m), all equal, integers, wide magnitudes that round when summed."""
    if kind == "uniform":
        return [rng.uniform(0, 100) for _ in range(n)]
    if kind == "grid":
        return [100 * rng.randint(0, 6) / 6 for _ in range(n)]
    if kind == "equal":
        return [rng.choice([0.0, 100.0, 1 / 3])] * n
    if kind == "integers":
        return [float(rng.randint(-5, 5)) for _ in range(n)]
    if kind == "wide":
        return [rng.choice([1e16, -1e16, 1.0, 0.1, 1e-8, 3.0]) * rng.random() for _ in range(n)]
    raise ValueError(kind)


KINDS = ("uniform", "grid", "equal", "integers", "wide")
SIZES = (1, 2, 3, 4, 7, 9, 10, 11, 13, 14, 20, 57)


def same(new: object, old: object) -> None:
    assert repr(new) == repr(old)


# --- The draws -----------------------------------------------------------------------------------


def test_the_twister_continues_random_random() -> None:
    for seed in (0, 1, 2**40 + 3, "seed"):
        rng = random.Random(seed)
        k = resampling.random_k(resampling.twister(seed), 5000)  # type: ignore[arg-type]
        assert [int(x) / 2**53 for x in k] == [rng.random() for _ in range(5000)]


def test_plans_are_the_draws_of_choices_and_choice() -> None:
    for seed, n, resamples in ((0, 1, 3), (1, 5, 40), (2, 518, 3)):
        rng = random.Random(seed)
        (plan,) = resampling.index_blocks(seed, n, resamples)
        assert plan.T.tolist() == [rng.choices(range(n), k=n) for _ in range(resamples)]
        rng = random.Random(seed)
        (signs,) = resampling.sign_blocks(seed, n, resamples)
        expected = [[rng.choice((-1, 1)) for _ in range(n)] for _ in range(resamples)]
        assert signs.T.tolist() == expected


# --- Identity on seeds and shapes --------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_bootstrap_ci_is_the_loop_it_replaced(n: int) -> None:
    rng = random.Random(n)
    for seed in range(6):
        for kind in KINDS:
            values = scores(rng, n, kind)
            for level, resamples in ((0.95, 400), (0.5, 37), (0.99, 1), (0.9, 2)):
                kwargs = {"level": level, "resamples": resamples, "seed": seed}
                same(bootstrap_ci(values, **kwargs), ref_bootstrap_ci(values, **kwargs))


@pytest.mark.parametrize("n", SIZES)
def test_paired_test_is_the_loop_it_replaced(n: int) -> None:
    rng = random.Random(100 + n)
    for seed in range(6):
        for kind in KINDS:
            a, b = scores(rng, n, kind), scores(rng, n, kind)
            # 2^n ≤ resamples enumerates every flip, otherwise samples: both sides of the switch.
            for resamples in (300, 2**n, 2**n - 1, 5):
                if resamples < 1 or resamples > 5000:
                    continue
                kwargs = {"resamples": resamples, "seed": seed}
                same(paired_test(a, b, **kwargs), ref_paired_test(a, b, **kwargs))


@pytest.mark.parametrize("n", SIZES)
def test_gain_recovered_ci_is_the_loop_it_replaced(n: int) -> None:
    rng = random.Random(200 + n)
    for seed in range(3):
        for kind in KINDS:
            blurred = scores(rng, n, kind)
            # Oracle gaps from clearly positive to often negative: none, some and most
            # resamples undefined, and point estimates that are undefined.
            for spread in (0.5, 10.0, 40.0):
                oracle = [b + rng.uniform(-spread, 2 * spread) for b in blurred]
                score = [b + rng.uniform(-spread, spread) for b in blurred]
                for level, resamples in ((0.95, 200), (0.2, 41), (0.8, 1)):
                    kwargs = {"level": level, "resamples": resamples, "seed": seed}
                    for min_gap in (0.0, 1.0):
                        same(
                            gain_recovered_ci(score, blurred, oracle, min_gap=min_gap, **kwargs),
                            ref_gain_recovered_ci(
                                score, blurred, oracle, min_gap=min_gap, **kwargs
                            ),
                        )


def test_the_report_sized_calls_are_the_loops_they_replaced() -> None:
    """What a report computes: 518 instances, 10 000 resamples, seed 0 — once, and again from
    the kept resampling plan."""
    rng = random.Random(518)
    a = scores(rng, 518, "grid")
    b = [min(100.0, max(0.0, x - 5 + rng.gauss(0, 10))) for x in a]
    o = [min(100.0, x + 15 + rng.gauss(0, 10)) for x in a]
    interval, recovered = ref_bootstrap_ci(a), ref_gain_recovered_ci(b, a, o)
    for _ in range(2):
        same(bootstrap_ci(a), interval)
        same(gain_recovered_ci(b, a, o), recovered)
    same(paired_test(a, b), ref_paired_test(a, b))


def test_paired_difference_on_common_ids_is_the_loop_it_replaced() -> None:
    rng = random.Random(7)
    for seed in range(4):
        a = {f"i{i}": rng.uniform(0, 100) for i in range(30) if rng.random() < 0.8}
        b = {f"i{i}": rng.uniform(0, 100) for i in range(30) if rng.random() < 0.8}
        kwargs = {"resamples": 500, "seed": seed}
        same(paired_difference(a, b, **kwargs), ref_paired_difference(a, b, **kwargs))
    with pytest.raises(ValueError, match="share no"):
        paired_difference({"x": 1.0}, {"y": 1.0})


def test_batched_statistics_are_each_columns_own() -> None:
    """Columns drawn side by side (of one length, sharing a plan, padded to a fast width, in
    batches) give each column the numbers it gets alone, and alone it gets the loop's."""
    rng = random.Random(21)
    columns = [
        scores(rng, n, kind)
        for n in (1, 2, 3, 9, 14, 14, 14, 57)
        for kind in KINDS
        for _ in range(2 if n == 14 else 1)
    ]
    rng.shuffle(columns)
    for resamples, seed in ((300, 0), (37, 5), (1, 2)):
        kwargs = {"resamples": resamples, "seed": seed}
        for k in (1, 2, 3, 5, 8, len(columns)):  # padded widths, and several batches
            batch = columns[:k]
            expected = [ref_bootstrap_ci(c, **kwargs) for c in batch]
            same(bootstrap_cis(batch, **kwargs), expected)
            pairs = [(c, columns[-1 - i][: len(c)]) for i, c in enumerate(batch)]
            pairs = [(a, b + [0.5] * (len(a) - len(b))) for a, b in pairs]
            same(paired_tests(pairs, **kwargs), [ref_paired_test(a, b, **kwargs) for a, b in pairs])


def test_batched_statistics_in_more_batches_than_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_BATCH_COLUMNS", 3)
    rng = random.Random(22)
    columns = [scores(rng, 12, "uniform") for _ in range(8)]
    same(bootstrap_cis(columns, resamples=99), [ref_bootstrap_ci(c, resamples=99) for c in columns])


def test_batched_differences_and_their_errors() -> None:
    rng = random.Random(23)
    maps = [
        {f"i{i}": rng.uniform(0, 100) for i in range(25) if rng.random() < 0.7} for _ in range(6)
    ]
    pairs = [(maps[i], maps[j]) for i in range(6) for j in range(i + 1, 6)]
    kwargs = {"resamples": 200, "seed": 1}
    same(
        paired_differences(pairs, **kwargs),
        [ref_paired_difference(a, b, **kwargs) for a, b in pairs],
    )
    with pytest.raises(ValueError, match="share no"):
        paired_differences([(maps[0], maps[1]), ({"x": 1.0}, {"y": 1.0})])
    with pytest.raises(ValueError, match="no values"):
        bootstrap_cis([[1.0, 2.0], []])
    with pytest.raises(ValueError, match="same, non-zero length"):
        paired_tests([([1.0], [2.0]), ([1.0, 2.0], [1.0])])
    assert bootstrap_cis([]) == [] and paired_tests([]) == []


def outcome(call: Any, *args: Any, **kwargs: Any) -> str:
    try:
        return repr(call(*args, **kwargs))
    except Exception as e:
        return type(e).__name__


def test_no_resamples_ends_as_before() -> None:
    """resamples ≤ 0 is no interval: the loops raised IndexError, except that one instance
    needs no resampling, and a sign-flip test over no flips had p = 1."""
    for resamples in (0, -3):
        for n in (1, 2, 5):
            a, b = [float(i) for i in range(n)], [0.5] * n
            kwargs = {"resamples": resamples}
            assert outcome(bootstrap_ci, a, **kwargs) == outcome(ref_bootstrap_ci, a, **kwargs)
            assert outcome(paired_test, a, b, **kwargs) == outcome(ref_paired_test, a, b, **kwargs)
            assert outcome(gain_recovered_ci, a, b, b, **kwargs) == "ValueError"
    assert outcome(paired_test, [1.0], [0.0], resamples=0) != "IndexError"


def test_integer_inputs_and_string_seeds_as_before() -> None:
    ints = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]
    other = [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2, 3, 5, 3]
    same(bootstrap_ci(ints, resamples=300), ref_bootstrap_ci(ints, resamples=300))
    same(paired_test(ints, other, resamples=300), ref_paired_test(ints, other, resamples=300))
    # A seed Random hashes: not kept between calls, the same draws all the same.
    values = [float(v) for v in ints]
    for _ in range(2):
        same(
            bootstrap_ci(values, resamples=300, seed="abc"),  # type: ignore[arg-type]
            ref_bootstrap_ci(values, resamples=300, seed="abc"),  # type: ignore[arg-type]
        )


def test_nan_and_infinite_scores_come_out_as_before() -> None:
    """Not values a report should hold, but whatever the loops made of them (a NaN makes
    Python's sort order depend on where it stood) comes out unchanged."""
    rng = random.Random(11)
    nan, inf = math.nan, math.inf
    for seed in range(4):
        for special in (nan, inf, -inf):
            for n in (2, 5, 30):
                values = scores(rng, n, "uniform")
                values[rng.randrange(n)] = special
                other = scores(rng, n, "uniform")
                same(
                    bootstrap_ci(values, resamples=200, seed=seed),
                    ref_bootstrap_ci(values, resamples=200, seed=seed),
                )
                same(
                    paired_test(values, other, resamples=200, seed=seed),
                    ref_paired_test(values, other, resamples=200, seed=seed),
                )
                oracle = [v + 20 for v in other]
                oracle[rng.randrange(n)] = special
                for s, b, o in ((values, other, oracle), (other, values, oracle)):
                    same(
                        gain_recovered_ci(s, b, o, resamples=200, seed=seed, min_gap=0.0),
                        ref_gain_recovered_ci(s, b, o, resamples=200, seed=seed, min_gap=0.0),
                    )


def test_block_boundaries_and_uncached_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Draws generated a few at a time, and never kept, are the same draws: blocks split
    resamples (and sign flips carry accepted words over to the next block)."""
    monkeypatch.setattr(resampling, "BLOCK_DRAWS", 7)
    monkeypatch.setattr(resampling, "CACHED_DRAWS", 0)
    rng = random.Random(3)
    for n in (1, 2, 3, 8, 15, 16):
        a, b = scores(rng, n, "uniform"), scores(rng, n, "grid")
        o = [x + 30 for x in b]
        kwargs = {"resamples": 101, "seed": n}
        same(bootstrap_ci(a, **kwargs), ref_bootstrap_ci(a, **kwargs))
        same(paired_test(a, b, **kwargs), ref_paired_test(a, b, **kwargs))
        same(gain_recovered_ci(a, b, o, **kwargs), ref_gain_recovered_ci(a, b, o, **kwargs))


def test_kept_plans_are_not_changed_by_their_users() -> None:
    first = bootstrap_ci([1.0, 2.0, 3.0, 10.0], resamples=50, seed=4)
    paired_test([1.0, 2.0, 3.0, 10.0], [0.0] * 4, resamples=50, seed=4)
    assert bootstrap_ci([1.0, 2.0, 3.0, 10.0], resamples=50, seed=4) == first
    (plan,) = resampling.cached_plan(resampling.index_blocks, 4, 4, 50)
    assert not plan.flags.writeable
    with pytest.raises(ValueError):
        plan[0, 0] = 0


# --- The summation both sides rely on --------------------------------------------------------


def awkward_columns(rng: random.Random) -> list[list[float]]:
    """Columns whose sums round differently by order and method: mixed magnitudes,
    cancellation, -0.0, and overflow."""
    pool = [1e16, -1e16, 1.0, 0.1, 0.2, -0.3, 1e-300, 2.0**-60, 1e308, -1e308, 3.0, -0.0, 0.0]
    columns = [[rng.choice(pool) * rng.choice([1, 1.5, -1]) for _ in range(9)] for _ in range(400)]
    columns += [[-0.0] * 5, [0.0, -0.0], [1e308, 1e308, -1e308], [math.inf, 1.0, -math.inf]]
    columns += [[math.nan, 1.0], [1.0, 1e100, 1.0, -1e100], [0.1] * 10]
    # Long columns, alone and side by side: where numpy's own sum would switch to pairwise.
    columns += [[rng.choice(pool) * rng.random() for _ in range(518)] for _ in range(3)]
    columns += [[rng.choice(pool) * rng.random() for _ in range(700)]]
    return columns


def test_python_sum_is_this_interpreters_sum() -> None:
    columns = awkward_columns(random.Random(1))
    width = max(len(c) for c in columns)
    for length in range(1, width + 1):
        block = [c for c in columns if len(c) == length]
        if not block:
            continue
        rows = np.array(block).T
        with np.errstate(all="ignore"):
            got = resampling.python_sum(iter(rows))
        assert repr(got.tolist()) == repr([sum(c) for c in block])


def test_python_sum_on_312_is_cpythons_neumaier_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compensated branch (taken on Python ≥ 3.12) against CPython's loop transcribed."""
    monkeypatch.setattr(resampling, "COMPENSATED_SUM", True)
    columns = awkward_columns(random.Random(2))
    for length in sorted({len(c) for c in columns}):
        block = [c for c in columns if len(c) == length]
        with np.errstate(all="ignore"):
            got = resampling.python_sum(iter(np.array(block).T))
        assert repr(got.tolist()) == repr([neumaier_sum(c) for c in block])
    # A different sum from adding left to right, so the branch is not the plain one again.
    assert neumaier_sum([0.1] * 10) == 1.0 != functools.reduce(operator.add, [0.1] * 10)


def test_statistics_on_312_are_the_loops_with_neumaier_sums(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The statistics through the compensated branch equal the reference loops run with
    CPython 3.12's sum(): every sum() call of both swapped for the transcription."""
    monkeypatch.setattr(resampling, "COMPENSATED_SUM", True)
    # Both modules' own sum() calls (the point estimates) as on 3.12 too.
    monkeypatch.setitem(ref_bootstrap_ci.__globals__, "sum", neumaier_sum)
    monkeypatch.setattr(metrics, "sum", neumaier_sum, raising=False)
    rng = random.Random(5)
    for n in (2, 9, 40):
        a = scores(rng, n, "wide")
        b = scores(rng, n, "uniform")
        o = [x + 20 for x in b]
        kwargs = {"resamples": 150, "seed": n}
        same(bootstrap_ci(a, **kwargs), ref_bootstrap_ci(a, **kwargs))
        same(gain_recovered_ci(a, b, o, **kwargs), ref_gain_recovered_ci(a, b, o, **kwargs))
    a, b = scores(rng, 40, "wide"), scores(rng, 40, "wide")
    same(paired_test(a, b, resamples=150), ref_paired_test(a, b, resamples=150))


# --- The mean over seeds ---------------------------------------------------------------------


def test_mean_is_statistics_mean() -> None:
    rng = random.Random(9)
    pool = [0.0, -0.0, 100.0, 1 / 3, 2 / 3, 0.1, 1e-310, 5e-324, 1e300, -1e300, 1.7e308]
    cases: list[list[Any]] = [
        [rng.choice(pool) * rng.choice([1, -1]) for _ in range(k)]
        for k in (1, 2, 3, 5)
        for _ in range(400)
    ]
    cases += [[rng.uniform(0, 100) for _ in range(k)] for k in (1, 2, 3, 518) for _ in range(50)]
    cases += [[1.7e308, 1.7e308], [-0.0, -0.0], [1e16, 1.0, -1e16], [0.1] * 10]
    # Left to statistics.mean: ints (a whole mean stays an int), non-finite, mixed, Fractions.
    cases += [[1, 2], [1, 2, 4], [1.5, 2], [math.nan, 1.0], [math.inf, 1.0], [Fraction(1, 3)] * 2]
    for values in cases:
        assert repr(mean(values)) == repr(statistics.mean(values)), values
        assert repr(mean(iter(values))) == repr(statistics.mean(values))
    with pytest.raises(statistics.StatisticsError):
        mean([])
