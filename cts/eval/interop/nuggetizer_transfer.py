"""Moving nuggets and labels between nuggetizer's files and this toolkit (the formats:
cts/eval/interop/nuggetizer.py): import nuggetizer's nuggets into a dataset (merged with or in place
of its golden nuggets, weights from importance by the weight map), and export a dataset's nuggets
and a run's judge labels as nuggetizer's nuggets and assignments."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cts.eval.data.dataset import DatasetSource, load_instances, sample_sources
from cts.eval.data.schema import Golden, Instance, Nugget, Record
from cts.eval.interop.nuggetizer import (
    ASSIGNMENT,
    NuggetizedQuery,
    NuggetizerError,
    WeightMap,
    read_nuggets,
    refuse,
    same_text,
)
from cts.eval.run.config_sections import ALL_CONDITIONS
from cts.eval.run.fingerprint import dataset_digest
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import RunDir
from cts.foundation.disk import write_whole
from cts.foundation.yaml_config import read_yaml
from cts.webdancer.corpus import Problem

# -- import: nuggetizer's nuggets into a dataset -------------------------------------------------

#: Languages written without spaces between words: their answers' length counts characters.
_UNSPACED = {"zh", "ja", "th", "lo", "km", "my"}


@dataclass
class ImportReport:
    """What `merge_nuggets` changed."""

    instances: int = 0
    #: Instances the file gave nuggets to, in dataset order.
    updated: list[str] = field(default_factory=list)
    added: int = 0
    #: Nuggets the instance had (same text): their weight was taken from the file.
    matched: int = 0
    reweighted: int = 0
    #: Nuggets the file does not have, removed with `replace`.
    dropped: int = 0
    #: Nuggets of the updated instances that cite no evidence.
    without_sources: int = 0
    defaulted_importance: int = 0
    #: Qids whose `query` is neither the instance's fused nor its blurred query.
    other_query: list[str] = field(default_factory=list)


def _fresh_id(taken: set[str]) -> str:
    n = len(taken) + 1
    while f"n{n}" in taken:
        n += 1
    taken.add(f"n{n}")
    return f"n{n}"


def _merged(
    instance: Instance,
    given: NuggetizedQuery,
    weights: WeightMap,
    replace: bool,
    report: ImportReport,
) -> Instance:
    old = list(instance.golden.nuggets) if instance.golden else []
    # A dataset may hold one text in several nuggets (other weights, other sources): the
    # file's weight goes to each of them, every one keeping its own id and sources.
    by_text: dict[str, list[Nugget]] = {}
    for nugget in old:
        by_text.setdefault(same_text(nugget.text), []).append(nugget)
    taken = {n.id for n in old}
    reweighted: dict[str, Nugget] = {}  # by id: the instance's nuggets the file names
    added: list[Nugget] = []
    for text, importance in given.nuggets:
        weight = weights.weights[importance]
        had = by_text.get(same_text(text), [])
        if not had:
            report.added += 1
            added.append(Nugget(id=_fresh_id(taken), text=text, weight=weight))
        for nugget in had:
            report.matched += 1
            report.reweighted += nugget.weight != weight
            reweighted[nugget.id] = nugget.model_copy(update={"weight": weight})
    kept = [reweighted.get(n.id, n) for n in old if not replace or n.id in reweighted]
    report.dropped += len(old) - len(kept)
    nuggets = kept + added
    report.without_sources += sum(not n.source_ids for n in nuggets)
    golden = (instance.golden or Golden(nuggets=nuggets)).model_copy(update={"nuggets": nuggets})
    return instance.model_copy(update={"golden": golden})


def merge_nuggets(
    instances: Sequence[Instance],
    queries: Sequence[NuggetizedQuery],
    weights: WeightMap,
    replace: bool = False,
    dataset_label: str = "the dataset",
) -> tuple[list[Instance], ImportReport]:
    """`instances` with each qid's nuggets merged into the instance of that id: each nugget of
    the instance with the file's text (one or several) keeps its id and sources and takes the
    file's weight, a new one is added with a fresh id `nK` and no sources; with `replace`, the
    instance's nuggets the file does not have are dropped. NuggetizerError for a qid no
    instance has, or an importance the weight map does not weigh (every one, each at its
    file:line)."""
    by_id = {i.id: i for i in instances}
    problems: list[Problem] = []
    for given in queries:
        if given.qid not in by_id:
            message = f"unknown qid {given.qid!r}: no instance with this id in {dataset_label}"
            problems.append(Problem(given.file, given.line, "qid", message))
        for i, (_, importance) in enumerate(given.nuggets):
            if importance not in weights.weights:
                message = (
                    f"{importance!r} is not in the weight map ({weights.describe()}); "
                    "weigh it with --weight-map"
                )
                problems.append(
                    Problem(given.file, given.line, f"nuggets[{i}].importance", message)
                )
    if problems:
        raise NuggetizerError(problems)
    report = ImportReport(instances=len(instances))
    given_for = {q.qid: q for q in queries}
    merged: list[Instance] = []
    for instance in instances:
        found = given_for.get(instance.id)
        if found is None:
            merged.append(instance)
            continue
        merged.append(_merged(instance, found, weights, replace, report))
        report.updated.append(instance.id)
        report.defaulted_importance += found.defaulted
        known = {same_text(instance.fused_query), same_text(instance.blurred_query)}
        if found.query is not None and same_text(found.query) not in known:
            report.other_query.append(instance.id)
    return merged, report


def _writable(out: Path) -> Path:
    if out.is_dir():
        raise refuse(str(out), None, "--out", "is a directory; name a file")
    return out


def write_dataset(instances: Iterable[Instance], out: Path) -> int:
    """A dataset JSONL (the shape `golden build` writes), whole or not at all."""
    lines = [json.dumps(i.model_dump(mode="json"), ensure_ascii=False) + "\n" for i in instances]
    write_whole(_writable(out), "".join(lines))
    return len(lines)


def import_nuggets(
    nuggets_file: Path,
    dataset: str,
    out: Path,
    weights: WeightMap,
    replace: bool = False,
    split: str | None = None,
) -> ImportReport:
    """Read a nuggets file and a dataset (`sample`: every split, as `golden export` and `golden
    audit` read it; or a dataset file in our shape), merge, and write the dataset to `out`.
    Problems of either input raise before anything is written."""
    queries = read_nuggets(nuggets_file)
    sources = (
        sample_sources(split) if dataset == "sample" else [DatasetSource(path=dataset, split=split)]
    )
    instances = [i for source in sources for i in load_instances(source)]
    merged, report = merge_nuggets(instances, queries, weights, replace, dataset)
    write_dataset(merged, out)
    return report


# -- export: a dataset's nuggets, a run's labels --------------------------------------------------


def nugget_rows(instances: Iterable[Instance], weights: WeightMap) -> list[dict[str, Any]]:
    """A nuggets file's lines: one per instance with golden nuggets, in dataset order."""
    return [
        {
            "query": i.fused_query,
            "qid": i.id,
            "nuggets": [
                {"text": n.text, "importance": weights.importance(n.weight)}
                for n in i.golden.nuggets
            ],
        }
        for i in instances
        if i.golden is not None
    ]


def write_jsonl(rows: Iterable[Mapping[str, Any]], out: Path) -> int:
    lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in rows]
    write_whole(_writable(out), "".join(lines))
    return len(lines)


def response_length(answer: str, language: str) -> int:
    """Words of the answer, as TREC RAG counts them; characters (spaces aside) for languages
    written without spaces between words."""
    if language.split("-")[0].lower() in _UNSPACED:
        return sum(not c.isspace() for c in answer)
    return len(answer.split())


@dataclass
class AssignmentExport:
    """What `export_assignments` wrote and what it left out (why → records)."""

    written: int = 0
    run_ids: list[str] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)


def assignment_rows(
    records: Iterable[Record],
    instances: Sequence[Instance],
    weights: WeightMap,
    run_name: str,
) -> tuple[list[dict[str, Any]], AssignmentExport]:
    """An assignments file's lines: one per judged record, ordered by condition (the study's
    order), instance (dataset order) and seed; `run_id` is `RUN_NAME.CONDITION.seedS`, the
    answer's system, condition and seed. Records the judge labelled nothing for are counted
    by why, never written with invented assignments."""
    order = {i.id: n for n, i in enumerate(instances)}
    by_id = {i.id: i for i in instances}
    conditions: dict[str, int] = {c: n for n, c in enumerate(ALL_CONDITIONS)}
    export = AssignmentExport()
    rows: list[dict[str, Any]] = []
    ranked = sorted(
        records,
        key=lambda r: (
            conditions.get(r.condition, len(conditions)),
            r.condition,
            order.get(r.instance_id, -1),
            r.seed,
        ),
    )
    for record in ranked:
        instance = by_id.get(record.instance_id)
        if record.error is not None:
            export.skipped[f"failed at {record.error.get('stage', '?')}"] += 1
            continue
        if not record.labels:
            export.skipped["not judged (no labels)"] += 1
            continue
        if instance is None or instance.golden is None:
            export.skipped["instance not in the dataset"] += 1
            continue
        nuggets = instance.golden.nuggets
        if set(record.labels) != {n.id for n in nuggets}:
            export.skipped["labels name other nuggets than the dataset's"] += 1
            continue
        run_id = f"{run_name}.{record.condition}.seed{record.seed}"
        rows.append(
            {
                "query": instance.fused_query,
                "qid": instance.id,
                "answer_text": record.answer,
                "response_length": response_length(record.answer, instance.language),
                "run_id": run_id,
                "nuggets": [
                    {
                        "text": n.text,
                        "importance": weights.importance(n.weight),
                        "assignment": ASSIGNMENT[record.labels[n.id]["label"]],
                    }
                    for n in nuggets
                ],
            }
        )
        if run_id not in export.run_ids:
            export.run_ids.append(run_id)
    export.written = len(rows)
    return rows, export


def run_instances(run: RunDir, dataset: str | None = None) -> list[Instance]:
    """The instances a run was judged against: its config's dataset (or that dataset's source
    read from `dataset`), every one, refused (NuggetizerError) when it is not the dataset the
    run's records were made with (its fingerprint)."""
    experiment = run.read_config().experiment
    source = experiment.dataset.model_copy(update={"limit": None})
    if dataset is not None:
        source = source.model_copy(update={"path": dataset})
    instances = load_instances(source)
    document, _ = read_yaml(run.config)
    ran_on = (document.get("fingerprint") or {}).get("dataset")
    if ran_on is not None and ran_on != dataset_digest(instances):
        raise refuse(
            source.path,
            None,
            "<dataset>",
            f"not the dataset {run.root} ran on (its fingerprint.dataset differs): its nuggets "
            "or queries changed since, and labels would be paired with other nuggets",
        )
    return instances


def export_assignments(
    run_dir: Path,
    out: Path,
    weights: WeightMap,
    conditions: Sequence[str] = (),
    run_name: str | None = None,
    dataset: str | None = None,
) -> AssignmentExport:
    """A run's judged answers as an assignments file (only `conditions`, when given)."""
    run = RunDir(run_dir)
    instances = run_instances(run, dataset)
    records = list(RecordStore(run_dir).completed().values())
    if conditions:
        known = {r.condition for r in records}
        for condition in conditions:
            if condition not in known:
                found = ", ".join(sorted(known)) or "none"
                raise refuse(
                    str(run_dir),
                    None,
                    "--condition",
                    f"no records of {condition!r} (found: {found})",
                )
        records = [r for r in records if r.condition in conditions]
    rows, export = assignment_rows(records, instances, weights, run_name or run.root.resolve().name)
    if rows:
        write_jsonl(rows, out)
    return export
