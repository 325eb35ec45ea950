"""Golden construction's data (once per dataset, docs/data-and-golden.md): WebDancer on the fused
query, its trace archived, weighted nuggets extracted from that trace
(cts/eval/run/golden_search.py, which calls the model), each nugget's `source_ids` restricted to
evidence ids the trace showed; here, the dataset those records make.

The search run is the pipeline's `golden` key (one per instance, seeded with `golden.seed`,
which is never an evaluation seed, and cached apart from evaluation runs: the `oracle` condition
is then a fresh run on the same fused query, never served the answers of the run its nuggets came
from; cts/eval/run/oracle.py says when a greedy searcher makes it decode that run again), so it
shards, resumes and survives preemption like any evaluation; `finish` then writes the dataset with
`golden` filled in, which an experiment's `dataset.path` can point at."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cts.eval.data.schema import Golden, GoldenSearcher, Instance

#: The pipeline condition (records/golden/…) of golden construction's search runs.
GOLDEN = "golden"


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
