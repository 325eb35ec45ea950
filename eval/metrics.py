"""The restore score and its statistics: pure functions over labelled nuggets (DESIGN §2).

restore_score_100 = 100 · Σ w·s / Σ w with s(full) = 1, s(partial) = 0.5, s(none) = 0; the strict
variant scores partial as 0; the unweighted one gives every nugget weight 1.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Label = Literal["full", "partial", "none"]
LABEL_SCORE: dict[str, float] = {"full": 1.0, "partial": 0.5, "none": 0.0}
STRICT_SCORE: dict[str, float] = {"full": 1.0, "partial": 0.0, "none": 0.0}


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


def gain_recovered(score: float, blurred: float, oracle: float) -> float | None:
    """(score − blurred) / (oracle − blurred): the share of the oracle's gain a clarifier
    restores. None when the oracle gains nothing over blurred (undefined)."""
    gap = oracle - blurred
    if abs(gap) < 1e-9:
        return None
    return (score - blurred) / gap


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


@dataclass(frozen=True)
class PairedTest:
    mean_difference: float
    low: float
    high: float
    p_value: float
    n: int


def paired_test(
    a: Sequence[float], b: Sequence[float], *, resamples: int = 10_000, seed: int = 0
) -> PairedTest:
    """a − b over the same instances: a bootstrap CI of the mean difference and a two-sided
    paired sign-flip permutation p-value (exact when 2^n ≤ resamples)."""
    if len(a) != len(b) or not a:
        raise ValueError("paired samples need the same, non-zero length")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    observed = abs(sum(diffs) / n)
    if 2**n <= resamples:
        flips = [[1 - 2 * ((mask >> i) & 1) for i in range(n)] for mask in range(2**n)]
    else:
        rng = random.Random(seed)
        flips = [[rng.choice((-1, 1)) for _ in range(n)] for _ in range(resamples)]
    extreme = sum(
        1
        for signs in flips
        if abs(sum(s * d for s, d in zip(signs, diffs, strict=True)) / n) >= observed - 1e-12
    )
    ci = bootstrap_ci(diffs, resamples=resamples, seed=seed)
    return PairedTest(ci.mean, ci.low, ci.high, extreme / len(flips), n)
