"""The restore score and its statistics: pure functions over labelled nuggets
(docs/reading-the-report.md).

restore_score_100 = 100 · Σ w·s / Σ w with s(full) = 1, s(partial) = 0.5, s(none) = 0; the strict
variant scores partial as 0; the unweighted one gives every nugget weight 1.

Statistics, each written so that it cannot mislead:

- ``gain_recovered`` — (score − blurred) / (oracle − blurred), None unless the oracle's gap over
  blurred is positive and at least ``min_gap`` points (a negative gap flips the sign, a tiny one
  multiplies noise); callers show "undefined (gap x.x)".
- ``gain_recovered_ci`` — the same ratio on paired per-instance scores with a paired percentile
  bootstrap; resamples whose gap is ≤ 0 are counted, and when too many of them are undefined the
  interval is reported as unbounded (``low``/``high`` None) rather than invented.
- ``bootstrap_ci`` — mean with a percentile bootstrap CI over instances.
- ``ratio_ci`` — a ratio of sums (changed labels over labels) with a bootstrap CI that resamples
  whole instances.
- ``paired_test`` — a − b on the same instances: bootstrap CI and a two-sided sign-flip p-value,
  exact when all 2^n flips fit in ``resamples``, else Monte Carlo with p = (b + 1)/(B + 1), so
  never 0. ``smallest_p`` is the smallest p it can give on n instances (2/2^n when exact): an
  MDE at a level below it is undefined (cts/eval/score/power.py).
- ``paired_difference`` — ``paired_test`` on two instance-id → score maps, on their common ids.
- ``bootstrap_cis``, ``paired_tests``, ``paired_differences`` — the same for many columns (or
  pairs) at once, with the same numbers: columns of one length share their resamples, and
  drawing them side by side costs a fraction of drawing them one by one.
- ``holm`` — Holm–Bonferroni step-down adjusted p-values for a family of comparisons.
- ``mean`` — ``statistics.mean`` (the exact mean, correctly rounded), fast on floats.

The resampling statistics are vectorised with numpy but give the numbers of the pure-Python
loops they replaced, bit for bit, on a fixed seed (tests/eval/score/test_metrics_fast.py keeps
those loops and compares): the resamples are the draws ``random.Random(seed)`` made, taken
from numpy's MT19937 started in that generator's state, and each resampled mean is summed in
the order and with the rounding of the ``sum()`` the loops called (cts/eval/score/resampling.py).
Inputs are Python floats (or integers whose sums stay below 2**53); other number types are
converted to floats.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from cts.eval.score.resampling import (
    ascending,
    index_blocks,
    plan,
    python_sum,
    resampled_means,
    sign_blocks,
    signed,
)

Label = Literal["full", "partial", "none"]
LABEL_SCORE: dict[str, float] = {"full": 1.0, "partial": 0.5, "none": 0.0}
STRICT_SCORE: dict[str, float] = {"full": 1.0, "partial": 0.0, "none": 0.0}

# Score differences are sums of means of floats: a gap that prints as 1.0 may be 0.9999999999.
# Comparisons against a threshold allow this much so that the printed gap and the verdict agree.
#: The score's key in a record's `scores` and in every summary.
SCORE = "restore_score_100"
_EPS = 1e-9


def restore_score(
    labels: Mapping[str, Label],
    weights: Mapping[str, float],
    *,
    strict: bool = False,
    weighted: bool = True,
) -> float:
    """Score of one answer, 0–100. Every weighted nugget must be labelled."""
    missing = set(weights) - set(labels)
    if missing:
        raise ValueError(f"nuggets without a label: {sorted(missing)}")
    scale = STRICT_SCORE if strict else LABEL_SCORE
    total = sum(weights[n] if weighted else 1.0 for n in weights)
    if total <= 0:
        raise ValueError("the nugget weights sum to zero")
    gained = sum((weights[n] if weighted else 1.0) * scale[labels[n]] for n in weights)
    return 100.0 * gained / total


def gain_recovered(
    score: float, blurred: float, oracle: float, min_gap: float = 1.0
) -> float | None:
    """(score − blurred) / (oracle − blurred): the share of the oracle's gain a clarifier
    restores.

    Defined only when the gap oracle − blurred is positive and at least ``min_gap`` points;
    otherwise None. A negative gap would flip the sign (clarify 50, blurred 60, oracle 40 would
    read +0.5) and a gap of a fraction of a point turns score noise into large ratios. Callers
    show "undefined (gap x.x)" with the gap they computed.
    """
    if min_gap < 0:
        raise ValueError("min_gap must be non-negative")
    gap = oracle - blurred
    if gap <= _EPS or gap < min_gap - _EPS:
        return None
    return (score - blurred) / gap


def mean(values: Iterable[float]) -> float:
    """``statistics.mean(values)``, the same float, without its Fractions when every value is a
    finite float: their exact sum over one power-of-two denominator, divided once (int / int is
    correctly rounded). Anything else (ints, NaN, no values) goes to ``statistics.mean``.
    A report takes thousands of these, one per instance and condition."""
    data = list(values)
    if not data or not all(type(v) is float and math.isfinite(v) for v in data):
        return statistics.mean(data)
    ratios = [v.as_integer_ratio() for v in data]
    scale = max(d for _, d in ratios)
    return sum(m * (scale // d) for m, d in ratios) / (len(data) * scale)


@dataclass(frozen=True)
class RatioEstimate:
    """A gain-recovered estimate with its bootstrap interval.

    ``low``/``high`` are None when the interval is unbounded: more than (1 − level)/2 of the
    resamples had no defined ratio (gap ≤ 0), i.e. the oracle's gap over blurred is not reliably
    positive. ``undefined_share`` is that share of resamples in every case.
    """

    value: float
    low: float | None
    high: float | None
    n: int
    undefined_share: float


def gain_recovered_ci(
    score: Sequence[float],
    blurred: Sequence[float],
    oracle: Sequence[float],
    *,
    min_gap: float = 1.0,
    level: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> RatioEstimate | None:
    """Gain recovered on paired per-instance scores with a paired percentile bootstrap CI.

    The three sequences hold one value per instance, for the same instances in the same order.
    The point estimate is the ratio of the means, ``gain_recovered(mean s, mean b, mean o,
    min_gap)``; None when that is undefined (then there is nothing to put an interval around).

    Each resample draws instance indices with replacement — the same indices for all three
    sequences, which keeps the pairing — and computes (mean s − mean b) / (mean o − mean b).
    ``min_gap`` guards only the point estimate; a resample's ratio is undefined only when its gap
    is ≤ 0, where the ratio has no meaning (as the gap falls to 0 it diverges).

    Undefined resamples. The interval is the percentile interval over ALL B resamples, with the
    undefined ones placed adversarially: for the lower bound they are taken to lie below every
    defined ratio, for the upper bound above every one (as if −∞ and +∞). So with u undefined,
    the lower bound is the ⌊αB⌋-th smallest value of the full list (0-based) = the (⌊αB⌋ − u)-th
    defined one, and symmetrically at the top, where α = (1 − level)/2. Why not simply drop them:
    that quietly conditions on the gap being positive and narrows the interval exactly when the
    denominator is shakiest; the adversarial placement can only widen it, and it meets the
    unbounded case continuously — once u > αB the bound would have to be one of the undefined
    resamples, so ``low`` and ``high`` are None (the report says "CI undefined: the oracle's gap
    over blurred is not reliably positive"). ``undefined_share`` = u / B is always reported.
    """
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
    # One row per instance: its score, blurred and oracle, resampled together (the pairing).
    table = np.array([score, blurred, oracle], dtype=np.float64).T.copy()
    found: list[np.ndarray] = []
    undefined = 0
    with np.errstate(all="ignore"):
        for block in plan(index_blocks, seed, n, resamples):
            mean_s, mean_b, mean_o = resampled_means(table, block).T
            gap = mean_o - mean_b
            defined = ~(gap <= 0)  # a NaN gap is not ≤ 0: its ratio is kept, as NaN
            undefined += int(len(gap) - np.count_nonzero(defined))
            # Same expression as gain_recovered, so that identical instances reproduce the
            # point estimate bit for bit.
            found.append((mean_s[defined] - mean_b[defined]) / gap[defined])
    share = undefined / resamples
    alpha = (1 - level) / 2
    # Order-statistic positions in the full list of B resamples, as in bootstrap_ci; _EPS keeps
    # αB = 250.00000000000003 (float noise in 1 − 0.95) from moving a position.
    low_pos = max(0, math.floor(alpha * resamples + _EPS))
    high_pos = min(resamples - 1, math.ceil((1 - alpha) * resamples - _EPS) - 1)
    # Undefined resamples sit first (for the low bound) or last (for the high bound).
    if low_pos < undefined or high_pos >= resamples - undefined:
        return RatioEstimate(value, None, None, n, share)
    ratios = ascending(np.concatenate(found))
    return RatioEstimate(
        value, float(ratios[low_pos - undefined]), float(ratios[high_pos]), n, share
    )


@dataclass(frozen=True)
class Estimate:
    mean: float
    low: float
    high: float
    n: int


def bootstrap_ci(
    values: Sequence[float], *, level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> Estimate:
    """Mean with a percentile bootstrap confidence interval over instances."""
    return bootstrap_cis([values], level=level, resamples=resamples, seed=seed)[0]


def bootstrap_cis(
    columns: Sequence[Sequence[float]],
    *,
    level: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> list[Estimate]:
    """``bootstrap_ci`` of each column, the same numbers, computed together: the columns of one
    length share their resampling plan, and drawing them side by side costs a fraction of
    drawing them one by one (a report's score table has 15 such columns)."""
    if not all(columns):
        raise ValueError("no values")
    alpha = (1 - level) / 2
    out: dict[int, Estimate] = {}
    for n, positions in _by_length(columns):
        if n == 1:
            for i in positions:
                only = sum(columns[i]) / 1
                out[i] = Estimate(only, only, only, 1)
            continue
        means = _resampled_means([columns[i] for i in positions], seed, resamples)
        for j, i in enumerate(positions):
            ranked = ascending(means[:, j])
            low = ranked[max(0, math.floor(alpha * resamples))]
            high = ranked[min(resamples - 1, math.ceil((1 - alpha) * resamples) - 1)]
            out[i] = Estimate(sum(columns[i]) / n, float(low), float(high), n)
    return [out[i] for i in range(len(columns))]


def ratio_ci(
    numerators: Sequence[float],
    denominators: Sequence[float],
    *,
    level: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> Estimate:
    """Σ numerators / Σ denominators with a percentile bootstrap CI that resamples whole
    clusters (one numerator and denominator each, e.g. an instance's changed labels and its
    labels): the items of one cluster move together, so resampling them one by one would
    make the interval too narrow. Each resample's ratio is its mean numerator over its mean
    denominator (the same as the ratio of its sums); every denominator must be positive."""
    n = len(numerators)
    if n == 0 or len(denominators) != n:
        raise ValueError("a ratio needs the same, non-zero number of numerators and denominators")
    if not all(d > 0 for d in denominators):
        raise ValueError("every cluster's denominator must be positive")
    value = sum(numerators) / sum(denominators)
    if n == 1:
        return Estimate(value, value, value, 1)
    table = np.array([numerators, denominators], dtype=np.float64).T.copy()
    with np.errstate(all="ignore"):
        means = np.concatenate(
            [resampled_means(table, block) for block in plan(index_blocks, seed, n, resamples)]
        )
    ranked = ascending(means[:, 0] / means[:, 1])
    alpha = (1 - level) / 2
    low = ranked[max(0, math.floor(alpha * resamples))]
    high = ranked[min(resamples - 1, math.ceil((1 - alpha) * resamples) - 1)]
    return Estimate(value, float(low), float(high), n)


#: Columns drawn side by side at most: bounds the buffers (resamples × columns floats) for a
#: report of many systems; the gain of batching has levelled off well before.
_BATCH_COLUMNS = 64


def _by_length(columns: Sequence[Sequence[float]]) -> list[tuple[int, list[int]]]:
    """The columns' positions grouped by length (one resampling plan each), in batches."""
    groups: dict[int, list[int]] = {}
    for i, column in enumerate(columns):
        groups.setdefault(len(column), []).append(i)
    return [
        (n, positions[start : start + _BATCH_COLUMNS])
        for n, positions in groups.items()
        for start in range(0, len(positions), _BATCH_COLUMNS)
    ]


def _resampled_means(columns: Sequence[Sequence[float]], seed: int, resamples: int) -> np.ndarray:
    """(resamples, k): every bootstrap resample's mean of each of k columns of length n."""
    n = len(columns[0])
    table = np.array(columns, dtype=np.float64).T.copy()  # one row per instance
    with np.errstate(all="ignore"):
        drawn = [resampled_means(table, block) for block in plan(index_blocks, seed, n, resamples)]
    return np.concatenate(drawn) if drawn else np.empty((0, len(columns)))


#: Sign flips a paired test draws unless told otherwise (its bootstrap takes as many).
RESAMPLES = 10_000


def smallest_p(n: int, resamples: int = RESAMPLES) -> float:
    """The smallest two-sided p ``paired_test`` can give on n instances with `resamples`: with
    every flip enumerated (2^n ≤ resamples), 2/2^n, since the identity and the flip of every
    sign are always as extreme as the observed mean; with flips sampled, 1/(resamples + 1),
    when no sampled flip is. A level below it can never be reached, whatever the difference."""
    if n < 1:
        return 1.0
    return 2 / 2**n if 2**n <= resamples else 1 / (resamples + 1)


@dataclass(frozen=True)
class PairedTest:
    mean_difference: float
    low: float
    high: float
    p_value: float
    n: int


def paired_test(
    a: Sequence[float], b: Sequence[float], *, resamples: int = RESAMPLES, seed: int = 0
) -> PairedTest:
    """a − b over the same instances: a bootstrap CI of the mean difference and a two-sided
    paired sign-flip permutation p-value.

    When 2^n ≤ resamples every flip is enumerated and p is exact (the identity flip is among
    them, so p ≥ 1/2^n). Otherwise B = resamples flips are sampled and p = (b + 1)/(B + 1),
    b counting sampled flips at least as extreme as observed: the observed assignment counts as
    one more, which keeps the test valid and p never 0 — a Monte Carlo p of 0 would claim more
    than B samples can show.
    """
    return paired_tests([(a, b)], resamples=resamples, seed=seed)[0]


def paired_tests(
    pairs: Sequence[tuple[Sequence[float], Sequence[float]]],
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> list[PairedTest]:
    """``paired_test`` of each (a, b), the same numbers, computed together like
    ``bootstrap_cis``: pairs of one length share their flips and their resamples."""
    diffs: list[list[float]] = []
    for a, b in pairs:
        if len(a) != len(b) or not a:
            raise ValueError("paired samples need the same, non-zero length")
        diffs.append([x - y for x, y in zip(a, b, strict=True)])
    p_values: dict[int, float] = {}
    for n, positions in _by_length(diffs):
        observed = np.array([abs(sum(diffs[i]) / n) for i in positions])
        exact = 2**n <= resamples
        flips: Iterable[np.ndarray]
        if exact:
            # Column `mask` flips the sign of difference i where bit i of mask is set.
            masks = np.arange(2**n)
            flips = (1 - 2 * ((masks >> np.arange(n)[:, None]) & 1),)
            count = 2**n
        else:
            flips = plan(sign_blocks, seed, n, resamples)
            count = max(0, resamples)  # the flips drawn
        table = np.array([diffs[i] for i in positions], dtype=np.float64).T.copy()
        extreme = np.zeros(len(positions), dtype=np.int64)
        with np.errstate(all="ignore"):
            for signs in flips:
                means = python_sum(signed(table, signs)) / n  # (columns, flips)
                extreme += np.count_nonzero(np.abs(means) >= (observed - 1e-12)[:, None], axis=1)
        for j, i in enumerate(positions):
            found = int(extreme[j])
            p_values[i] = found / count if exact else (found + 1) / (count + 1)
    cis = bootstrap_cis(diffs, resamples=resamples, seed=seed)
    return [PairedTest(ci.mean, ci.low, ci.high, p_values[i], ci.n) for i, ci in enumerate(cis)]


def paired_difference(
    a: Mapping[str, float],
    b: Mapping[str, float],
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> PairedTest:
    """``paired_test`` of a − b on the instance ids both maps score (sorted, so the result does
    not depend on insertion order). Ids only one side scored are left out — ``n`` says how many
    were compared. ValueError when the maps share no id: an empty comparison is no evidence."""
    return paired_differences([(a, b)], resamples=resamples, seed=seed)[0]


def paired_differences(
    pairs: Sequence[tuple[Mapping[str, float], Mapping[str, float]]],
    *,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> list[PairedTest]:
    """``paired_difference`` of each (a, b), computed together (``paired_tests``)."""
    columns = []
    for a, b in pairs:
        common = sorted(set(a) & set(b))
        if not common:
            raise ValueError("the two systems share no scored instance")
        columns.append(([a[i] for i in common], [b[i] for i in common]))
    return paired_tests(columns, resamples=resamples, seed=seed)


def holm(p_values: Mapping[str, float]) -> dict[str, float]:
    """Holm–Bonferroni step-down adjusted p-values, keyed (and ordered) as given.

    With the m p-values sorted ascending, the i-th (0-based) is multiplied by m − i; a running
    maximum keeps the adjusted values non-decreasing in that order (a smaller raw p never gets a
    larger adjusted one), and each is capped at 1. Ties get equal adjusted values whatever their
    order. Reject at level α exactly where the adjusted p ≤ α.
    """
    for key, p in p_values.items():
        if not 0.0 <= p <= 1.0:  # also rejects NaN
            raise ValueError(f"p-value for {key!r} is not in [0, 1]: {p}")
    m = len(p_values)
    adjusted: dict[str, float] = {}
    running = 0.0
    for rank, key in enumerate(sorted(p_values, key=lambda k: p_values[k])):
        running = max(running, min(1.0, (m - rank) * p_values[key]))
        adjusted[key] = running
    return {key: adjusted[key] for key in p_values}
