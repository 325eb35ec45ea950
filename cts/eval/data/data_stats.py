"""`cts data stats`: what a dataset holds, as numbers."""

from __future__ import annotations

from collections import Counter
from statistics import mean, median
from typing import Any

from cts.agents.user_answerer import unit_spans
from cts.eval.data.schema import CONSTRAINT_TYPES, Instance

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


def _share(count: int, n: int) -> float | None:
    """count of n, rounded; None where there is nothing to share."""
    return round(count / n, 3) if n else None


def _type_shares(counts: Counter[str]) -> dict[str, Any]:
    """The removed-type mix as shares of every removed constraint (n)."""
    n = sum(counts.values())
    return {"n": n, "shares": {t: _share(counts.get(t, 0), n) for t in CONSTRAINT_TYPES}}


def _span_lengths(lengths: list[int]) -> dict[str, Any]:
    return {
        "n": len(lengths),
        "min": min(lengths),
        "median": median(lengths),
        "mean": round(mean(lengths), 2),
        "max": max(lengths),
    }


def span_stats(instances: list[Instance]) -> dict[str, Any]:
    """How many removed constraints record the text blurring removed (`with_span`: count of
    n), and the spans' lengths per language, in the User Answerer's units (a word, or one CJK
    character: `unit_spans`, so a Chinese span and an English one count the same way)."""
    removed = sum(len(i.removed_constraints) for i in instances)
    lengths: dict[str, list[int]] = {}
    for instance in instances:
        for span in instance.removed_spans:
            if span:  # "": the dataset gave this constraint's type only
                lengths.setdefault(instance.language, []).append(len(unit_spans(span)))
    spans = sum(len(found) for found in lengths.values())
    return {
        "with_span": {"n": removed, "count": spans, "share": _share(spans, removed)},
        "span_units": {
            language: _span_lengths(found) for language, found in sorted(lengths.items())
        },
    }


def dataset_stats(instances: list[Instance]) -> dict[str, Any]:
    nuggets = [len(i.golden.nuggets) for i in instances if i.golden]
    weights = Counter(n.weight for i in instances if i.golden for n in i.golden.nuggets)
    constraint_counts = Counter[str](c for i in instances for c in i.removed_constraints)
    return {
        "instances": len(instances),
        "with_golden": len(nuggets),
        "languages": dict(Counter(i.language for i in instances).most_common()),
        "removed_constraints": {t: constraint_counts.get(t, 0) for t in CONSTRAINT_TYPES},
        "removed_constraint_shares": _type_shares(constraint_counts),
        "removed_spans": span_stats(instances),
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
