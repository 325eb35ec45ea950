"""How many instances and seeds a sweep needs to detect a difference, from a pilot's scores.

`cts estimate --detect D` asks: which instances × seeds plans detect a true difference of D
restore points between two clarifier systems, at 80% power and α = 0.05, and what each costs?
The report Holm-corrects a pair's clarify@k rows as one family, so a row must clear α/m to be
its family's first rejection (m: the sweep's clarify@k conditions): plans are made at that
level, or their power falls short (≈ 65% instead of 80% with three clarify@k conditions).
A pilot runs one system, so the two systems' noise is read off the pilot's own paired
comparison of two conditions (default: its first clarify@k against blurred): how much a
difference varies from instance to instance (the interaction) and how much one seed's score
wanders (within). The two systems are assumed to be as noisy as each other; see
docs/planning-a-sweep.md for when that is too rosy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from scipy import stats

from cts.eval.data.schema import Record
from cts.eval.estimate import Estimate
from cts.eval.run.pipeline import clarify_turns
from cts.eval.score.metrics import SCORE
from cts.eval.score.power import DifferenceNoise, Plans, difference_noise, instances_needed, plan


class DetectError(ValueError):
    """The pilot cannot say what a plan needs (a condition it lacks, too few instances)."""


def seed_scores(records: Iterable[Record], condition: str) -> dict[str, list[float]]:
    """instance → its restore score per seed under `condition`, for the instances scored on
    every seed they have (a failed or unscored record leaves its instance out)."""
    found: dict[str, dict[int, float | None]] = {}
    for r in records:
        if r.condition == condition:
            found.setdefault(r.instance_id, {})[r.seed] = r.scores.get(SCORE)
    return {
        i: [v for _, v in sorted(seeds.items()) if v is not None]
        for i, seeds in found.items()
        if all(v is not None for v in seeds.values())
    }


def default_pair(conditions: list[str]) -> tuple[str, str]:
    """The first clarify@k against blurred: the comparison whose noise stands for two systems'."""
    clarify = [c for c in conditions if clarify_turns(c)]
    if not clarify or "blurred" not in conditions:
        raise DetectError(
            "--detect reads its noise from a clarify@k condition against blurred: the pilot has "
            f"{', '.join(conditions)} (give --detect-between A,B)"
        )
    return clarify[0], "blurred"


@dataclass(frozen=True)
class PlanCost:
    instances: int
    seeds: int
    mde: float
    #: Keys one system runs: instances × seeds × conditions.
    keys: int
    #: GPU-hours of those keys scaled from the estimate (None: a model's throughput unknown).
    gpu_hours: float | None
    #: The instances the plan's seeds need if the noise is at the pilot's 90% upper bound
    #: (None: more than the dataset holds).
    instances_if_noisier: int | None = None


#: The one-sided confidence of the pilot's upper bound on the noise.
NOISIER = 0.9


@dataclass(frozen=True)
class Detection:
    between: tuple[str, str]
    noise: DifferenceNoise
    plans: Plans
    costs: list[PlanCost]
    #: The level each comparison is reported at, and the clarify@k rows of its Holm family:
    #: the plans are made at alpha / family.
    alpha: float = 0.05
    family: int = 1
    #: How much larger the noise's variance may be than the pilot's (its NOISIER upper bound).
    noisier: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "between": list(self.between),
            "noise": self.noise.as_dict(),
            **asdict(self.plans),
            "family_alpha": self.alpha,
            "family": self.family,
            "noisier_factor": self.noisier,
            "costs": [asdict(c) for c in self.costs],
        }


def noise_upper_factor(instances: int, confidence: float = NOISIER) -> float:
    """How many times the pilot's variance of the differences the true one may be, at its
    one-sided `confidence` upper bound ((n − 1) / χ²_{1−confidence, n−1}): a small pilot's
    noise is itself uncertain, and a plan on its point estimate falls short as often as the
    noise was under-read."""
    df = instances - 1
    return float(df / stats.chi2.ppf(1 - confidence, df))


def detect(
    records: list[Record],
    found: Estimate,
    difference: float,
    *,
    between: tuple[str, str] | None = None,
    wanted: float = 0.8,
    max_seeds: int = 8,
    alpha: float = 0.05,
) -> Detection:
    """The plans that detect `difference` points, with their keys and GPU-hours, from the
    pilot's records (`found` is the estimate made from them: the dataset's size, the
    conditions, the per-key cost), at the level of the pair's Holm family."""
    pair = between or default_pair(found.conditions)
    missing = [c for c in pair if c not in found.conditions]
    if missing:
        raise DetectError(f"--detect-between: the pilot has no condition {', '.join(missing)}")
    a, b = (seed_scores(records, c) for c in pair)
    if len(set(a) & set(b)) < 2:
        raise DetectError(
            f"the pilot scored fewer than two instances under both {pair[0]} and {pair[1]}: "
            "pilot more instances (--pilot N)"
        )
    noise = difference_noise(a, b)
    family = sum(1 for c in found.conditions if clarify_turns(c)) if clarify_turns(pair[0]) else 1
    level = alpha / max(1, family)
    plans = plan(
        noise,
        difference,
        max_instances=found.sweep_instances,
        max_seeds=max_seeds,
        wanted=wanted,
        alpha=level,
    )
    noisier = noise_upper_factor(noise.instances)
    gpu = [m.gpu_hours.total for m in found.models if m.gpu_hours is not None]
    known = bool(found.models) and len(gpu) == len(found.models) and found.sweep_keys > 0
    per_key = sum(gpu) / found.sweep_keys if known else None
    conditions = len(found.conditions)
    costs = [
        PlanCost(
            p.instances,
            p.seeds,
            p.mde,
            p.instances * p.seeds * conditions,
            None if per_key is None else round(per_key * p.instances * p.seeds * conditions, 2),
            instances_needed(
                noise.at(p.seeds) * noisier, difference, found.sweep_instances, level, wanted
            ),
        )
        for p in plans.plans
    ]
    return Detection(pair, noise, plans, costs, alpha, max(1, family), noisier)
