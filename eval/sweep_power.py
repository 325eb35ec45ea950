"""How many instances and seeds a sweep needs to detect a difference, from a pilot's scores.

`cts estimate --detect D` asks: which instances × seeds plans detect a true difference of D
restore points between two clarifier systems, at 80% power and α = 0.05, and what each costs?
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

from eval.data.schema import Record
from eval.estimate import Estimate
from eval.run.pipeline import clarify_turns
from eval.score.power import DifferenceNoise, Plans, difference_noise, plan

SCORE = "restore_score_100"


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


@dataclass(frozen=True)
class Detection:
    between: tuple[str, str]
    noise: DifferenceNoise
    plans: Plans
    costs: list[PlanCost]

    def as_dict(self) -> dict[str, Any]:
        return {
            "between": list(self.between),
            "noise": self.noise.as_dict(),
            **asdict(self.plans),
            "costs": [asdict(c) for c in self.costs],
        }


def detect(
    records: list[Record],
    found: Estimate,
    difference: float,
    *,
    between: tuple[str, str] | None = None,
    wanted: float = 0.8,
    max_seeds: int = 8,
) -> Detection:
    """The plans that detect `difference` points, with their keys and GPU-hours, from the
    pilot's records (`found` is the estimate made from them: the dataset's size, the
    conditions, the per-key cost)."""
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
    plans = plan(
        noise, difference, max_instances=found.sweep_instances, max_seeds=max_seeds, wanted=wanted
    )
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
        )
        for p in plans.plans
    ]
    return Detection(pair, noise, plans, costs)
