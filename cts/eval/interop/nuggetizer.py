"""Golden nuggets and judge labels in the JSONL files of nuggetizer, the AutoNuggetizer framework
of the TREC 2024 RAG Track (https://github.com/castorini/nuggetizer, shapes as its README
documents them: https://github.com/castorini/nuggetizer/blob/main/README.md).

The two shapes read and written here, one JSON object per line:

- **nuggets**, what `nuggetizer create` writes and `nuggetizer assign --nuggets` reads::

    {"query": "What is Python?", "qid": "q1",
     "nuggets": [{"text": "Python is a programming language", "importance": "vital"},
                 {"text": "Python is used for data science", "importance": "okay"}]}

  `importance` is `vital` or `okay` (nuggetizer's own reader takes a nugget without one as
  `vital`, and so does `read_nuggets`). Other keys nuggetizer may add (`reasoning`, `trace`,
  `reasoning_traces`) are ignored when reading and never written.

- **assignments**, what `nuggetizer assign --input-kind answers` writes and `nuggetizer metrics`
  reads::

    {"query": "...", "qid": "q1", "answer_text": "...", "response_length": 42,
     "run_id": "run-123",
     "nuggets": [{"text": "...", "importance": "vital", "assignment": "support"}, ...]}

  `assignment` is `support`, `partial_support` or `not_support`.

Our side. A dataset's golden nuggets (cts/eval/data/schema.Nugget: id, text, weight, source_ids) are
keyed by instance id, nuggetizer's by `qid`: the two are the same id, and the `query` written
is the instance's fused query (the full intent the nuggets describe). Weights and importance
map through a `WeightMap`: importing, each importance word becomes the weight the map gives it
(default `vital=3,okay=1`: vital is "the question cannot be answered without it", our weight
3; okay is related but not needed, our context weight 1); exporting, a weight at or above
`vital_from` (default: the map's vital weight) is `vital`, any other `okay`. With three of our
weights and two importance words the mapping loses a level: a weight-2 nugget exports as `okay`
and imports back as 1. Weights the map gives round-trip exactly. Judge labels map one to one:
full ↔ support, partial ↔ partial_support, none ↔ not_support.

nuggetizer's files carry no evidence: an imported nugget that is new to the dataset has no
`source_ids`, so `cts golden audit` flags it as citing nothing that supports it — rightly, until
someone cites its evidence. A nugget whose text (spacing aside) is already the instance's keeps
its id and sources; only its weight is taken from the file.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from cts.eval.data.dataset import (
    DatasetError,
    DatasetSource,
    Row,
    load_instances,
    read_rows,
    sample_sources,
)
from cts.eval.data.schema import Golden, Instance, Nugget, Record
from cts.eval.run.config import ALL_CONDITIONS
from cts.eval.run.fingerprint import dataset_digest
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import RunDir
from cts.foundation.disk import write_whole
from cts.foundation.yaml_config import read_yaml
from cts.serving.outputs import valid_unicode
from cts.webdancer.corpus import Problem

VITAL, OKAY = "vital", "okay"
DEFAULT_WEIGHT_MAP = f"{VITAL}=3,{OKAY}=1"
#: Our judge labels → nuggetizer's assignments, and back.
ASSIGNMENT = {"full": "support", "partial": "partial_support", "none": "not_support"}
LABEL = {assignment: label for label, assignment in ASSIGNMENT.items()}
#: Languages written without spaces between words: their answers' length counts characters.
_UNSPACED = {"zh", "ja", "th", "lo", "km", "my"}


class Format(str, Enum):
    """The formats `cts golden import|export` and `cts judge export` exchange."""

    nuggetizer = "nuggetizer"


class NuggetizerError(DatasetError):
    """A nuggetizer file, or an option, with problems; each as `file:line: field: message`."""


def _refuse(where: str, line: int | None, field_name: str, message: str) -> NuggetizerError:
    return NuggetizerError([Problem(where, line, field_name, message)])


# -- weights ↔ importance ----------------------------------------------------------------------


@dataclass(frozen=True)
class WeightMap:
    """Importance word → weight (importing), and the weight from which a nugget is vital
    (exporting)."""

    weights: dict[str, float]
    vital_from: float

    def importance(self, weight: float) -> str:
        return VITAL if weight >= self.vital_from else OKAY

    def describe(self) -> str:
        pairs = ",".join(f"{k}={_number(v)}" for k, v in self.weights.items())
        return f"{pairs}; vital from weight {_number(self.vital_from)}"


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


def parse_weight_map(text: str = DEFAULT_WEIGHT_MAP, vital_from: float | None = None) -> WeightMap:
    """`vital=3,okay=1` (more words may be added, e.g. nuggetizer's `failed=1`). Both `vital`
    and `okay` are needed, vital weighing more; `vital_from` (default: vital's weight) must lie
    above okay's weight and at most at vital's, so that every weight the map gives exports as
    the word it came from. NuggetizerError naming the part that is wrong."""
    weights: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        word, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not word:
            raise _refuse(
                "--weight-map", None, part or "(empty)", "expected WORD=WEIGHT, e.g. vital=3"
            )
        if word in weights:
            raise _refuse("--weight-map", None, word, "given twice")
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not (math.isfinite(weight) and weight > 0):
            raise _refuse("--weight-map", None, word, f"must be a number > 0, got {value!r}")
        weights[word] = weight
    for word in (VITAL, OKAY):
        if word not in weights:
            raise _refuse("--weight-map", None, word, f"missing (e.g. {DEFAULT_WEIGHT_MAP})")
    if weights[VITAL] <= weights[OKAY]:
        raise _refuse("--weight-map", None, VITAL, "must weigh more than okay")
    threshold = weights[VITAL] if vital_from is None else vital_from
    if not (math.isfinite(threshold) and weights[OKAY] < threshold <= weights[VITAL]):
        raise _refuse(
            "--vital-from",
            None,
            "weight",
            f"must be above okay's weight ({_number(weights[OKAY])}) and at most vital's "
            f"({_number(weights[VITAL])}), got {threshold}",
        )
    return WeightMap(weights, threshold)


# -- reading nuggetizer files ------------------------------------------------------------------


def _same(text: str) -> str:
    """A nugget text as matched: spacing aside."""
    return " ".join(text.split())


def _rows(path: Path, problems: list[Problem]) -> Iterator[tuple[Row, dict[str, Any]]]:
    """Each row of `path` that could be read, with its data; a row that could not (or that
    holds a lone surrogate) is a `<row>` problem."""
    if path.suffix not in (".jsonl", ".ndjson", ".json"):
        raise _refuse(str(path), None, "<file>", "expected a .jsonl file (nuggetizer writes JSONL)")
    for row in read_rows(path):
        where = _lone_surrogate(row.data) if row.data is not None else None
        if where is not None:  # a `\ud800` escape: no dataset file could hold the text
            message = f"{where or 'a key'} holds a lone surrogate (a \\ud800 escape): not text"
            problems.append(Problem(row.file, row.line, "<row>", message))
        elif row.data is None:
            problems.append(Problem(row.file, row.line, "<row>", row.error or "unreadable"))
        else:
            yield row, row.data


def _lone_surrogate(value: Any, where: str = "") -> str | None:
    """Where in `value` (as `nuggets[0].text`) a string holds a lone surrogate, or None."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:  # not recursive: a row may nest hundreds of levels deep
        item, at = stack.pop()
        if isinstance(item, str):
            if valid_unicode(item) != item:
                return at
        elif isinstance(item, dict):
            if any(valid_unicode(str(key)) != key for key in item):
                return at
            # Reversed onto the stack: the first one in the file is found first.
            stack += reversed([(v, f"{at}.{k}" if at else str(k)) for k, v in item.items()])
        elif isinstance(item, list):
            stack += reversed([(child, f"{at}[{i}]") for i, child in enumerate(item)])
    return None


def _qid(data: dict[str, Any], row: Row, problems: list[Problem]) -> str | None:
    qid = data.get("qid")
    if isinstance(qid, int) and not isinstance(qid, bool):
        qid = str(qid)  # TREC topic ids are numbers in some files
    if qid is None:
        problems.append(Problem(row.file, row.line, "qid", "missing"))
    elif not isinstance(qid, str):
        problems.append(Problem(row.file, row.line, "qid", f"must be a string, got {qid!r}"))
    elif not qid.strip():
        problems.append(Problem(row.file, row.line, "qid", "empty"))
    else:
        return qid
    return None


@dataclass(frozen=True)
class _Item:
    #: text, importance and each key the caller needs, as written.
    values: dict[str, str]
    #: No importance was given: read as vital, as nuggetizer reads it.
    defaulted: bool


def _nugget_items(
    data: dict[str, Any], row: Row, problems: list[Problem], needs: Mapping[str, Iterable[str]]
) -> list[_Item]:
    """The row's nuggets with text, importance and each key of `needs` (whose value must be
    one of those listed), every problem added."""
    listed = data.get("nuggets")
    if listed is None:
        problems.append(Problem(row.file, row.line, "nuggets", "missing"))
        return []
    if not isinstance(listed, list):
        problems.append(Problem(row.file, row.line, "nuggets", "must be a list"))
        return []
    if not listed:
        problems.append(Problem(row.file, row.line, "nuggets", "empty"))
        return []
    items: list[_Item] = []
    first: dict[str, int] = {}
    for i, nugget in enumerate(listed):
        where = f"nuggets[{i}]"
        if not isinstance(nugget, dict):
            problems.append(Problem(row.file, row.line, where, "expected a JSON object"))
            continue
        before = len(problems)
        values: dict[str, str] = {}
        for key in ("text", "importance", *needs):
            value = nugget.get(key, VITAL if key == "importance" else None)
            if value is None:
                message = "missing"
            elif not isinstance(value, str):
                message = f"must be a string, got {value!r}"
            elif not value.strip():
                message = "empty"
            elif key in needs and value not in needs[key]:
                message = f"{value!r} is not one of {', '.join(needs[key])}"
            else:
                values[key] = value
                continue
            problems.append(Problem(row.file, row.line, f"{where}.{key}", message))
        if "text" in values:
            seen = first.setdefault(_same(values["text"]), i)
            if seen != i:
                message = f"the same text as nuggets[{seen}]"
                problems.append(Problem(row.file, row.line, f"{where}.text", message))
        if len(problems) == before:
            items.append(_Item(values, "importance" not in nugget))
    return items


@dataclass(frozen=True)
class NuggetizedQuery:
    """One line of a nuggets file."""

    qid: str
    query: str | None
    #: (text, importance) in the file's order.
    nuggets: list[tuple[str, str]]
    file: str
    line: int
    #: Nuggets without an importance, read as vital.
    defaulted: int = 0


def read_nuggets(path: Path) -> list[NuggetizedQuery]:
    """Every line of a nuggets file; NuggetizerError listing every problem (a line that is not
    JSON, a missing or empty qid, nuggets missing or not a list of {text, importance}, a qid
    given twice, two nuggets of one line with the same text)."""
    found: list[NuggetizedQuery] = []
    problems: list[Problem] = []
    first_line: dict[str, int] = {}
    for row, data in _rows(path, problems):
        before = len(problems)
        qid = _qid(data, row, problems)
        query = data.get("query")
        if query is not None and not isinstance(query, str):
            problems.append(
                Problem(row.file, row.line, "query", f"must be a string, got {query!r}")
            )
        items = _nugget_items(data, row, problems, {})
        if qid is not None:
            seen = first_line.setdefault(qid, row.line)
            if seen != row.line:
                message = f"qid {qid!r} given twice (first at line {seen})"
                problems.append(Problem(row.file, row.line, "qid", message))
        if qid is None or len(problems) > before:
            continue
        nuggets = [(n.values["text"], n.values["importance"]) for n in items]
        defaulted = sum(n.defaulted for n in items)
        text = query if isinstance(query, str) else None
        found.append(NuggetizedQuery(qid, text, nuggets, row.file, row.line, defaulted))
    if problems:
        raise NuggetizerError(problems)
    if not found:
        raise _refuse(str(path), None, "<file>", "no nuggets (an empty file)")
    return found


@dataclass(frozen=True)
class AssignedAnswer:
    """One line of an assignments file: an answer and each nugget's label, in our words."""

    qid: str
    run_id: str
    answer_text: str
    #: (text, importance, label) in the file's order; label is full, partial or none.
    nuggets: list[tuple[str, str, str]]
    file: str
    line: int


def read_assignments(path: Path) -> list[AssignedAnswer]:
    """Every line of an answers-assignment file; NuggetizerError listing every problem (those
    of a nuggets file, and an assignment that is not support, partial_support or
    not_support)."""
    found: list[AssignedAnswer] = []
    problems: list[Problem] = []
    for row, data in _rows(path, problems):
        before = len(problems)
        qid = _qid(data, row, problems)
        items = _nugget_items(data, row, problems, {"assignment": LABEL})
        run_id, answer = data.get("run_id", ""), data.get("answer_text", "")
        for key, value in (("run_id", run_id), ("answer_text", answer)):
            if not isinstance(value, str):
                message = f"must be a string, got {value!r}"
                problems.append(Problem(row.file, row.line, key, message))
        if qid is None or len(problems) > before:
            continue
        nuggets = [
            (n.values["text"], n.values["importance"], LABEL[n.values["assignment"]]) for n in items
        ]
        found.append(AssignedAnswer(qid, run_id, answer, nuggets, row.file, row.line))
    if problems:
        raise NuggetizerError(problems)
    return found


def labels_by_id(answer: AssignedAnswer, instance: Instance) -> dict[str, str]:
    """The answer's labels keyed by the instance's nugget ids (matched on text, spacing aside);
    NuggetizerError for a text the instance has no nugget with."""
    ids = {_same(n.text): n.id for n in (instance.golden.nuggets if instance.golden else [])}
    labels: dict[str, str] = {}
    problems: list[Problem] = []
    for i, (text, _, label) in enumerate(answer.nuggets):
        nugget_id = ids.get(_same(text))
        if nugget_id is None:
            message = f"no golden nugget of {instance.id!r} has this text"
            problems.append(Problem(answer.file, answer.line, f"nuggets[{i}].text", message))
        else:
            labels[nugget_id] = label
    if problems:
        raise NuggetizerError(problems)
    return labels


# -- import: nuggetizer's nuggets into a dataset -------------------------------------------------


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
        by_text.setdefault(_same(nugget.text), []).append(nugget)
    taken = {n.id for n in old}
    reweighted: dict[str, Nugget] = {}  # by id: the instance's nuggets the file names
    added: list[Nugget] = []
    for text, importance in given.nuggets:
        weight = weights.weights[importance]
        had = by_text.get(_same(text), [])
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
        known = {_same(instance.fused_query), _same(instance.blurred_query)}
        if found.query is not None and _same(found.query) not in known:
            report.other_query.append(instance.id)
    return merged, report


def _writable(out: Path) -> Path:
    if out.is_dir():
        raise _refuse(str(out), None, "--out", "is a directory; name a file")
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
        raise _refuse(
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
                raise _refuse(
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
