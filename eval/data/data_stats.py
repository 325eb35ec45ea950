"""`cts data stats`: what a dataset holds, as numbers."""

from __future__ import annotations

from collections import Counter
from statistics import mean
from typing import Any

from eval.data.schema import CONSTRAINT_TYPES, Instance

_CHARACTER_LANGUAGES = ("zh", "ja", "ko", "th")


def query_length(text: str, language: str) -> int:
    """Words, or characters for languages written without spaces."""
    if language.split("-")[0] in _CHARACTER_LANGUAGES:
        return len("".join(text.split()))
    return len(text.split())


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"min": 0, "mean": 0, "max": 0}
    return {"min": min(values), "mean": round(mean(values), 2), "max": max(values)}


def dataset_stats(instances: list[Instance]) -> dict[str, Any]:
    nuggets = [len(i.golden.nuggets) for i in instances if i.golden]
    weights = Counter(n.weight for i in instances if i.golden for n in i.golden.nuggets)
    constraint_counts = Counter[str](c for i in instances for c in i.removed_constraints)
    return {
        "instances": len(instances),
        "with_golden": len(nuggets),
        "languages": dict(Counter(i.language for i in instances).most_common()),
        "removed_constraints": {t: constraint_counts.get(t, 0) for t in CONSTRAINT_TYPES},
        "removed_per_instance": dict(
            sorted(Counter(len(i.removed_constraints) for i in instances).items())
        ),
        "nuggets_per_instance": _summary([float(n) for n in nuggets]),
        "weight_mix": {f"{w:g}": c for w, c in sorted(weights.items())},
        "blurred_query_length": _summary(
            [float(query_length(i.blurred_query, i.language)) for i in instances]
        ),
        "fused_query_length": _summary(
            [float(query_length(i.fused_query, i.language)) for i in instances]
        ),
    }
