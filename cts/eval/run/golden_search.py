"""Golden nuggets from a golden search run's trace: the model call of golden construction (the
nugget builder), apart from the data layer (cts/eval/data/golden.py), which only reads and
writes datasets. The pipeline's `golden` key calls it after its search."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cts.agents.nugget_builder import Evidence, build_nuggets
from cts.eval.data.schema import Instance, Nugget
from cts.serving.engine import ChatModel
from cts.serving.types import Sampling


class NoEvidence(ValueError):
    """The golden search run showed no evidence, so no nugget could be grounded."""


def trace_evidence(steps: Iterable[dict[str, Any]]) -> list[Evidence]:
    """Each tool observation that showed evidence (search hits, pages read; a failed visit
    shows none), with its ids: corpus doc ids, or URLs for web backends."""
    found = []
    for step in steps:
        shown = step.get("evidence", []) if step.get("kind") == "tool" else []
        if shown:
            ids = tuple(e["id"] for e in shown)
            found.append(Evidence(ids, step.get("result", ""), tuple(e["url"] for e in shown)))
    return found


async def golden_nuggets(
    engine: ChatModel,
    instance: Instance,
    answer: str,
    steps: Iterable[dict[str, Any]],
    sampling: Sampling,
    max_nuggets: int,
    max_evidence_chars: int,
) -> list[Nugget]:
    """Nuggets `n1…nN` for one instance from its golden trace; NoEvidence when the trace
    showed none (nothing could be cited)."""
    evidence = trace_evidence(steps)
    if not evidence:
        raise NoEvidence("the golden search run showed no evidence (no search hit, no page)")
    drafts = await build_nuggets(
        engine,
        instance.fused_query,
        answer,
        evidence,
        instance.language,
        sampling,
        max_nuggets=max_nuggets,
        max_evidence_chars=max_evidence_chars,
    )
    return [
        Nugget(id=f"n{i}", text=d.text, weight=d.weight, source_ids=list(d.source_ids))
        for i, d in enumerate(drafts, 1)
    ]
