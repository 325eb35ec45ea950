"""Whether a run's `oracle` is an independent upper bound or golden construction again.

The oracle searches the fused query, as golden construction did. Its requests are never served
from golden construction's cached answers (the response and visit caches key them by purpose,
cts/serving/cache.py), so it is always a fresh run. But a fresh *greedy* run of the searcher golden
construction ran greedily decodes the same trajectory: the oracle then finds exactly the
evidence the nuggets were extracted from, and its score is not an upper bound reached by
searching but the golden run scored against itself. That configuration is allowed — a greedy
searcher is a common, reproducible choice, and the clarify@k and blurred columns do not depend
on it — and the report names it beside the oracle column, with why."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cts.eval.data.schema import GoldenSearcher, Instance
from cts.eval.run.config import ResolvedExperiment


def golden_searcher(resolved: ResolvedExperiment) -> GoldenSearcher:
    """The searcher golden construction with `resolved` runs: its served model, temperature."""
    return GoldenSearcher(
        model=resolved.model_for("searcher").name,
        temperature=resolved.sampling_for("searcher").temperature,
    )


def oracle_independence(
    resolved: ResolvedExperiment, instances: Sequence[Instance] | None
) -> dict[str, Any] | None:
    """For a run with `oracle`: `repeats_golden` True (a greedy searcher on the model golden
    construction ran greedily, for `instances` of `of` golden instances), False, or None
    (cannot tell: golden built before its searcher was recorded, or the dataset does not
    load), with `why`. None for a run without the oracle."""
    experiment = resolved.experiment
    if "oracle" not in experiment.conditions or "searcher" not in experiment.roles:
        return None
    searcher = golden_searcher(resolved)
    found: dict[str, Any] = {"searcher": searcher.model, "temperature": searcher.temperature}
    if searcher.temperature > 0:
        return {**found, "repeats_golden": False, "why": "the searcher samples"}
    if instances is None:
        why = "the searcher is greedy and the run's dataset does not load to say who built it"
        return {**found, "repeats_golden": None, "why": why}
    searched = [i.golden for i in instances if i.golden is not None and i.golden.trace_id]
    same = [
        g
        for g in searched
        if g.searcher is not None
        and g.searcher.model == searcher.model
        and g.searcher.temperature == 0
    ]
    unrecorded = sum(g.searcher is None for g in searched)
    found.update(instances=len(same), of=len(searched), unrecorded=unrecorded)
    if not searched:
        return {**found, "repeats_golden": False, "why": "no nugget came from a search run"}
    if same:
        why = (
            f"the searcher is greedy (temperature 0) on {searcher.model}, the model golden "
            f"construction searched with greedily for {len(same)} of {len(searched)} golden "
            "instance(s): a fresh greedy run decodes the trajectory the nuggets were extracted "
            "from, so the oracle column is the golden run scored against itself, not an "
            "independent upper bound (sample the searcher, or build the nuggets with another "
            "searcher or temperature)"
        )
        return {**found, "repeats_golden": True, "why": why}
    if unrecorded:
        why = (
            f"the searcher is greedy (temperature 0) on {searcher.model}, and {unrecorded} "
            "golden instance(s) do not record golden construction's searcher (built before it "
            "was recorded): if it was this model, greedy too, the oracle repeats golden "
            "construction"
        )
        return {**found, "repeats_golden": None, "why": why}
    return {**found, "repeats_golden": False, "why": "golden construction ran another searcher"}


def oracle_warning(name: str, found: dict[str, Any] | None) -> str | None:
    """The report's line for a system whose oracle is (or may be) golden construction again."""
    if not found or found.get("repeats_golden") is False:
        return None
    if found["repeats_golden"]:
        return f"WARNING {name}: the oracle repeats golden construction: {found['why']}."
    return (
        f"WARNING {name}: cannot tell whether the oracle repeats golden construction: "
        f"{found['why']}."
    )
