"""Golden construction (once per dataset, docs/data-and-golden.md): WebDancer on the fused query,
its trace archived, weighted nuggets extracted from that trace, each nugget's `source_ids`
restricted to evidence ids the trace showed.

The search run is the pipeline's `golden` key (one per instance, seeded with `golden.seed`,
which is never an evaluation seed, and cached apart from evaluation runs: the `oracle` condition
is then a fresh run on the same fused query, never served the answers of the run its nuggets came
from; cts/eval/run/oracle.py says when a greedy searcher makes it decode that run again), so it
shards, resumes and survives preemption like any evaluation; `finish` then writes the dataset with
`golden` filled in, which an experiment's `dataset.path` can point at."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cts.agents.nugget_builder import Evidence, build_nuggets
from cts.eval.data.schema import Golden, GoldenSearcher, Instance, Nugget
from cts.serving.engine import ChatModel
from cts.serving.types import Sampling

#: The pipeline condition (records/golden/…) of golden construction's search runs.
GOLDEN = "golden"


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


@dataclass
class GoldenReport:
    """What `finish` wrote: instances with golden nuggets, and the ones without (and why)."""

    dataset: Path
    built: int
    missing: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    nuggets: int = 0
    weights: Counter[int] = field(default_factory=Counter)

    @property
    def complete(self) -> bool:
        return not self.missing and not self.failed


def golden_dataset(
    instances: list[Instance],
    records: dict[str, Any],
    out: Path,
    searcher: GoldenSearcher | None = None,
) -> GoldenReport:
    """Write `out` (JSONL, dataset order): every instance whose golden record has nuggets, with
    `golden` replaced by them and the `searcher` that ran the search. `records` maps instance
    id → its golden Record."""
    report = GoldenReport(dataset=out, built=0)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    with partial.open("w", encoding="utf-8") as f:
        for instance in instances:
            record = records.get(instance.id)
            if record is None:
                report.missing.append(instance.id)
                continue
            if record.error or not record.nuggets:
                error = record.error or {"kind": "no_nuggets", "message": ""}
                report.failed[instance.id] = f"{error['kind']}: {error['message']}"[:300]
                continue
            golden = Golden(
                nuggets=record.nuggets,
                trace_id=record.trace_id,
                seed=record.seed,
                searcher=searcher,
            )
            row = instance.model_copy(update={"golden": golden}).model_dump(mode="json")
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            report.built += 1
            report.nuggets += len(record.nuggets)
            report.weights.update(int(n.weight) for n in record.nuggets)
    partial.replace(out)
    return report
