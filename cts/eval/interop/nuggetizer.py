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

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from cts.eval.data.readers import DatasetError, Row, read_rows
from cts.eval.data.schema import Instance
from cts.serving.outputs import valid_unicode
from cts.webdancer.corpus import Problem

VITAL, OKAY = "vital", "okay"
DEFAULT_WEIGHT_MAP = f"{VITAL}=3,{OKAY}=1"
#: Our judge labels → nuggetizer's assignments, and back.
ASSIGNMENT = {"full": "support", "partial": "partial_support", "none": "not_support"}
LABEL = {assignment: label for label, assignment in ASSIGNMENT.items()}


class Format(str, Enum):
    """The formats `cts golden import|export` and `cts judge export` exchange."""

    nuggetizer = "nuggetizer"


class NuggetizerError(DatasetError):
    """A nuggetizer file, or an option, with problems; each as `file:line: field: message`."""


def refuse(where: str, line: int | None, field_name: str, message: str) -> NuggetizerError:
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
            raise refuse(
                "--weight-map", None, part or "(empty)", "expected WORD=WEIGHT, e.g. vital=3"
            )
        if word in weights:
            raise refuse("--weight-map", None, word, "given twice")
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not (math.isfinite(weight) and weight > 0):
            raise refuse("--weight-map", None, word, f"must be a number > 0, got {value!r}")
        weights[word] = weight
    for word in (VITAL, OKAY):
        if word not in weights:
            raise refuse("--weight-map", None, word, f"missing (e.g. {DEFAULT_WEIGHT_MAP})")
    if weights[VITAL] <= weights[OKAY]:
        raise refuse("--weight-map", None, VITAL, "must weigh more than okay")
    threshold = weights[VITAL] if vital_from is None else vital_from
    if not (math.isfinite(threshold) and weights[OKAY] < threshold <= weights[VITAL]):
        raise refuse(
            "--vital-from",
            None,
            "weight",
            f"must be above okay's weight ({_number(weights[OKAY])}) and at most vital's "
            f"({_number(weights[VITAL])}), got {threshold}",
        )
    return WeightMap(weights, threshold)


# -- reading nuggetizer files ------------------------------------------------------------------


def same_text(text: str) -> str:
    """A nugget text as matched: spacing aside."""
    return " ".join(text.split())


def _rows(path: Path, problems: list[Problem]) -> Iterator[tuple[Row, dict[str, Any]]]:
    """Each row of `path` that could be read, with its data; a row that could not (or that
    holds a lone surrogate) is a `<row>` problem."""
    if path.suffix not in (".jsonl", ".ndjson", ".json"):
        raise refuse(str(path), None, "<file>", "expected a .jsonl file (nuggetizer writes JSONL)")
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
            seen = first.setdefault(same_text(values["text"]), i)
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
        raise refuse(str(path), None, "<file>", "no nuggets (an empty file)")
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
    ids = {same_text(n.text): n.id for n in (instance.golden.nuggets if instance.golden else [])}
    labels: dict[str, str] = {}
    problems: list[Problem] = []
    for i, (text, _, label) in enumerate(answer.nuggets):
        nugget_id = ids.get(same_text(text))
        if nugget_id is None:
            message = f"no golden nugget of {instance.id!r} has this text"
            problems.append(Problem(answer.file, answer.line, f"nuggets[{i}].text", message))
        else:
            labels[nugget_id] = label
    if problems:
        raise NuggetizerError(problems)
    return labels
