"""Where the noise in restore scores comes from, and the smallest difference a run can detect.

One system's scores under one condition, y[i][j] for instance i and seed j, follow a one-way
random-effects model y = μ + a_i + e_ij: `between` is the variance of a_i (some instances are
harder than others), `within` the variance of e_ij (what a seed changes: the clarifier's
questions, the searcher's path, the judge's sampling). Their split says whether a sweep needs
more instances or more seeds.

A paired comparison of two systems (or conditions) works on D_i, the difference of the two
per-instance means over seeds. Its variance is `interaction` (the true difference varying from
instance to instance, which only more instances average out) plus the seeds' part,
(within_a + within_b) / k (within_a / k_a + within_b / k_b with unequal counts), which more
seeds shrink. The minimum detectable difference (MDE) of
a paired test on n instances is the true mean difference it finds with the given power at
level α (two-sided): from the noncentral t distribution of the paired t statistic, whose power
our sign-flip permutation test matches closely from about 10 instances on
(tests/eval/score/test_power.py checks both by simulation). On fewer the two part: the
sign-flip test's p is never below 2/2^n (`smallest_p`), so where that exceeds α it cannot
reject whatever the difference, and the MDE is None (the report prints "–" with why); no plan
asks for fewer instances than `fewest_instances`. Just above that bound its power at the MDE
falls short of the t test's (0.62 against 0.8 at 6 instances and α = 0.05; 0.78 at 8).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import optimize, stats

from cts.eval.score.metrics import RESAMPLES, smallest_p

#: Seeds-per-instance scores: instance → one score per seed.
SeedScores = Mapping[str, Sequence[float]]


@dataclass(frozen=True)
class Components:
    """Between- and within-instance variance of one system's scores under one condition."""

    instances: int
    #: Seeds per instance (the harmonic mean when instances have different counts).
    seeds: float
    between: float
    #: None with one seed per instance: the seeds' share cannot be told apart.
    within: float | None

    @property
    def seed_share(self) -> float | None:
        """within / (between + within): the share of a single score's variance from seeds."""
        if self.within is None:
            return None
        total = self.between + self.within
        return self.within / total if total > 0 else None

    @property
    def icc(self) -> float | None:
        """Intraclass correlation, between / (between + within): 1 − seed_share."""
        share = self.seed_share
        return None if share is None else 1.0 - share

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seed_share": self.seed_share, "icc": self.icc}


def components(scores: SeedScores) -> Components:
    """The ANOVA (method of moments) estimate: `within` pooled over instances with two or more
    seeds; `between` the variance of the instance means less the seeds' part of it
    (within × mean of 1/k_i), floored at 0."""
    rows = [np.asarray(v, dtype=np.float64) for v in scores.values() if len(v)]
    if len(rows) < 2:
        raise ValueError("variance components need at least two instances")
    counts = np.array([len(r) for r in rows])
    means = np.array([r.mean() for r in rows])
    dof = int((counts - 1).sum())
    within = float(sum(((r - r.mean()) ** 2).sum() for r in rows) / dof) if dof else None
    seeds_part = (within or 0.0) * float(np.mean(1.0 / counts))
    between = max(0.0, float(means.var(ddof=1)) - seeds_part)
    seeds = float(len(counts) / np.sum(1.0 / counts))
    return Components(len(rows), seeds, between, within)


@dataclass(frozen=True)
class DifferenceNoise:
    """The variance of a paired comparison's per-instance differences, and its parts."""

    instances: int
    #: Seeds a side: with unequal counts, the k at which (within_a + within_b) / k is seed_part.
    seeds: float
    #: Observed variance of D_i (ddof 1): what the paired test's MDE stands on.
    variance: float
    #: within_a / seeds_a + within_b / seeds_b, (within_a + within_b) / seeds with equal
    #: counts; None when either side has one seed.
    seed_part: float | None
    #: variance − seed_part, floored at 0: only more instances average it out.
    interaction: float | None

    @property
    def seed_share(self) -> float | None:
        if self.seed_part is None or self.variance <= 0:
            return None
        return min(1.0, self.seed_part / self.variance)

    def at(self, seeds: float) -> float:
        """Var(D_i) with `seeds` seeds per instance (the seeds' part scales as 1/seeds)."""
        if self.seed_part is None or self.interaction is None:
            return self.variance
        return self.interaction + self.seed_part * self.seeds / seeds

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seed_share": self.seed_share}


def difference_noise(a: SeedScores, b: SeedScores) -> DifferenceNoise:
    """The noise of a − b on the instances both score (paired by instance). Where every shared
    instance has as many seeds on each side, the seeds are paired too (seed s seeds both runs
    of a key: the sides' seed noise is correlated), and the seeds' part is read off the
    per-seed differences a_s − b_s; otherwise each side's seeds are its own runs and their
    parts add up."""
    common = sorted(set(a) & set(b))
    if len(common) < 2:
        raise ValueError("a paired comparison's noise needs at least two shared instances")
    diffs = np.array([np.mean(a[i]) - np.mean(b[i]) for i in common])
    variance = float(diffs.var(ddof=1))
    if all(len(a[i]) == len(b[i]) for i in common):
        per_seed = {i: [x - y for x, y in zip(a[i], b[i], strict=True)] for i in common}
        paired = components(per_seed)
        if paired.within is None:
            return DifferenceNoise(len(common), paired.seeds, variance, None, None)
        # The mean of k paired differences has seed variance within_d / k.
        seed_part = paired.within / paired.seeds
        interaction = max(0.0, variance - seed_part)
        return DifferenceNoise(len(common), paired.seeds, variance, seed_part, interaction)
    left = components({i: a[i] for i in common})
    right = components({i: b[i] for i in common})
    if left.within is None or right.within is None:
        return DifferenceNoise(len(common), left.seeds, variance, None, None)
    # Each side's mean over its own k seeds has seed variance within / k: the parts add up
    # side by side (pooling the withins over one mean seed count misweighs unequal counts).
    seed_part = left.within / left.seeds + right.within / right.seeds
    pooled = left.within + right.within
    # The k that gives this seed part with k seeds a side, so that `at` scales from it.
    seeds = pooled / seed_part if seed_part > 0 else 2.0 / (1.0 / left.seeds + 1.0 / right.seeds)
    return DifferenceNoise(len(common), seeds, variance, seed_part, max(0.0, variance - seed_part))


def power(difference: float, variance: float, n: int, alpha: float = 0.05) -> float:
    """The paired t test's power on n instances whose differences have this variance, for a
    true mean difference `difference`, two-sided at level alpha (noncentral t)."""
    if n < 2:
        return 0.0
    if variance <= 0:
        return 1.0 if difference else alpha
    df = n - 1
    critical = stats.t.ppf(1 - alpha / 2, df)
    shift = abs(difference) / math.sqrt(variance / n)
    found = float(stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift))
    if not math.isfinite(found):  # scipy's nct gives NaN far in its tail (tiny df, huge shift)
        return 1.0 if shift > critical else alpha
    return min(1.0, found)


class NonFiniteNoise(ValueError):
    """A variance that is NaN or infinite: some score was not a finite number."""


def can_reject(n: int, alpha: float, resamples: int = RESAMPLES) -> bool:
    """Whether the sign-flip test on n instances can give p ≤ alpha at all (`smallest_p`)."""
    return smallest_p(n, resamples) <= alpha


def fewest_instances(alpha: float, resamples: int = RESAMPLES) -> int | None:
    """The fewest instances (at least 2) on which the sign-flip test can reject at alpha; None
    when no number can (alpha below 1/(resamples + 1), the smallest sampled p)."""
    n = 2
    while not can_reject(n, alpha, resamples):
        if 2**n > resamples:  # sampled from here on: the smallest p no longer falls
            return None
        n += 1
    return n


def mde(
    variance: float,
    n: int,
    alpha: float = 0.05,
    wanted: float = 0.8,
    *,
    resamples: int = RESAMPLES,
) -> float | None:
    """The smallest true mean difference the paired test detects with power `wanted` at level
    alpha (two-sided), on n instances whose differences have this variance. None below two
    instances; None when the sign-flip test on n instances cannot reach p ≤ alpha (`can_reject`:
    its power is 0 at any difference); and None when the differences do not vary: no variance to
    scale by, and a sign-flip test's smallest p (2/2^n) decides what it can reject, not a
    difference. NonFiniteNoise for a NaN or infinite variance (the search would never end)."""
    if not math.isfinite(variance):
        raise NonFiniteNoise(f"the differences' variance is {variance}: a score is not finite")
    if n < 2 or variance <= 0 or not can_reject(n, alpha, resamples):
        return None
    scale = math.sqrt(variance / n)
    high = scale
    while power(high, variance, n, alpha) < wanted:
        high *= 2
    return float(optimize.brentq(lambda d: power(d, variance, n, alpha) - wanted, 0.0, high))


def paired_mde(
    differences: Sequence[float],
    alpha: float = 0.05,
    wanted: float = 0.8,
    *,
    resamples: int = RESAMPLES,
) -> float | None:
    """`mde` of the paired test on these per-instance differences (each instance's a − b, its
    seeds averaged first): their variance (ddof 1) on n = len(differences) instances, as the
    report's gains take it from `difference_noise`; `resamples` those of the test's sign flips.
    NonFiniteNoise when a difference is NaN or infinite."""
    values = np.asarray(differences, dtype=np.float64)
    if not np.isfinite(values).all():
        bad = int(np.count_nonzero(~np.isfinite(values)))
        raise NonFiniteNoise(f"{bad} of {len(values)} differences are NaN or infinite")
    if len(values) < 2:
        return None
    return mde(float(np.var(values, ddof=1)), len(values), alpha, wanted, resamples=resamples)


def mde_normal(variance: float, n: int, alpha: float = 0.05, wanted: float = 0.8) -> float:
    """The textbook closed form, (z_{1−α/2} + z_power) · sd / √n: what most power tables give.
    Smaller than `mde` for small n (it ignores the t distribution's heavier tails)."""
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(wanted)
    return float(z * math.sqrt(variance / n))


@dataclass(frozen=True)
class Plan:
    instances: int
    seeds: int
    #: The plan's MDE (≤ the difference asked for).
    mde: float


@dataclass(frozen=True)
class Plans:
    """The instances × seeds that detect `detect` points, cheapest first by keys."""

    detect: float
    power: float
    alpha: float
    plans: list[Plan]
    #: Instances needed with infinitely many seeds (the interaction alone); None when the
    #: noise cannot be split (one-seed data) or even that exceeds the dataset.
    instances_at_any_seeds: int | None
    #: Why no plan, or what the plans mean, in a sentence each.
    notes: list[str]


def instances_needed(
    variance: float, detect: float, most: int, alpha: float, wanted: float
) -> int | None:
    """The fewest instances (`fewest_instances`..most) whose MDE is at most `detect`; None if
    even `most` do not reach it. A variance of 0 needs no more than the test can reject on."""
    if detect <= 0:
        raise ValueError(f"the difference to detect must be positive, got {detect}")
    fewest = fewest_instances(alpha)
    if fewest is None or fewest > most:
        return None
    if variance <= 0:
        return fewest
    fits = lambda n: (mde(variance, n, alpha, wanted) or math.inf) <= detect  # noqa: E731
    if not fits(most):
        return None
    # Fewer than `fewest` cannot reject at all (mde None): the search starts at the bound.
    low, high = fewest, most
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle + 1, high)
    return low


def plan(
    noise: DifferenceNoise,
    detect: float,
    *,
    max_instances: int,
    max_seeds: int = 8,
    alpha: float = 0.05,
    wanted: float = 0.8,
) -> Plans:
    """Each seed count 1..max_seeds with the instances it needs to detect `detect` (at most
    max_instances, the dataset's size), where it needs fewer than fewer seeds do; ordered by
    keys (instances × seeds)."""
    notes: list[str] = []
    found: list[Plan] = []
    if noise.variance <= 0:
        notes.append(
            f"the pilot's differences do not vary over its {noise.instances} instances: no noise "
            "to plan with (pilot more instances, or compare another pair: --detect-between)"
        )
        return Plans(detect, wanted, alpha, [], None, notes)
    splittable = noise.seed_part is not None and noise.interaction is not None
    for seeds in range(1, (max_seeds if splittable else 1) + 1):
        n = instances_needed(noise.at(seeds), detect, max_instances, alpha, wanted)
        # A plan with more seeds is worth listing only if it needs fewer instances.
        if n is not None and (not found or n < found[-1].instances):
            found.append(Plan(n, seeds, mde(noise.at(seeds), n, alpha, wanted) or 0.0))
    at_any = None
    if splittable:
        assert noise.interaction is not None
        at_any = instances_needed(noise.interaction, detect, max_instances, alpha, wanted)
        share = noise.seed_share or 0.0
        if share < 0.1:
            notes.append(
                f"seeds make {share:.0%} of the differences' variance: more seeds cannot help, "
                "more instances can"
            )
    else:
        notes.append("one seed per instance: the seeds' share cannot be told apart (pilot 2+)")
    if not found:
        notes.append(
            f"the dataset's {max_instances} instances cannot detect {detect:g} points at "
            f"power {wanted:g} with up to {max_seeds if splittable else 1} seed(s)"
        )
    fewest = fewest_instances(alpha)
    if any(p.instances == fewest for p in found):
        notes.append(
            f"no plan has fewer than {fewest} instances: on fewer the sign-flip test's p cannot "
            f"reach α = {alpha:g} (it is never below 2/2^n)"
        )
    found.sort(key=lambda p: (p.instances * p.seeds, p.seeds))
    return Plans(detect, wanted, alpha, found, at_any, notes)


Interval = tuple[float, float]


@dataclass(frozen=True)
class ComponentIntervals:
    """Percentile bootstrap intervals, over instances, of one system's variance components
    (variances, as `Components` gives them: an sd's interval is their square roots) and of the
    seeds' share; each None where it cannot be had (see `component_cis`)."""

    #: Instances each resample draws (with replacement): the n the intervals stand on.
    instances: int
    resamples: int
    between: Interval | None
    #: None with one seed per instance, as `Components.within` is.
    within: Interval | None
    seed_share: Interval | None

    def as_dict(self) -> dict[str, float | None]:
        """`<part>_low`, `<part>_high` for between, within and seed_share (None: no interval)."""
        out: dict[str, float | None] = {}
        for part in ("between", "within", "seed_share"):
            interval: Interval | None = getattr(self, part)
            out[f"{part}_low"], out[f"{part}_high"] = interval or (None, None)
        return out


def _percentiles(values: np.ndarray, level: float) -> Interval | None:
    """The central `level` percentile interval of the values that are not NaN."""
    values = values[~np.isnan(values)]
    if not len(values):
        return None
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def component_cis(
    table: np.ndarray, *, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> ComponentIntervals:
    """Percentile bootstrap intervals of between, within and the seeds' share of one system's
    scores (`table`: one row per instance, one column per seed), from one set of resamples of
    the instances: each resample's components are `components()` on its rows. Between needs
    two instances; within and the share also two seeds."""
    if table.ndim != 2:
        raise ValueError(f"a seeds table has one row per instance, got shape {table.shape}")
    n, k = table.shape
    if n < 2:
        return ComponentIntervals(n, resamples, None, None, None)
    means = table.mean(axis=1)
    # Whole instances are resampled, seeds and all: instances are the sampling unit.
    rows = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    if k < 2:
        spread = _percentiles(means[rows].var(axis=1, ddof=1), level)
        return ComponentIntervals(n, resamples, spread, None, None)
    squares = ((table - means[:, None]) ** 2).sum(axis=1)
    within = squares[rows].sum(axis=1) / (n * (k - 1))
    between = np.maximum(0.0, means[rows].var(axis=1, ddof=1) - within / k)
    total = between + within
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(total > 0, within / total, np.nan)
    return ComponentIntervals(
        n,
        resamples,
        _percentiles(between, level),
        _percentiles(within, level),
        _percentiles(share, level),
    )
