"""The judge's labelled set (cts/eval/audit/calibration.py): a JSONL of (answer, nugget) pairs a
person labelled full / partial / none, the rows of one answer (its `group`) gathered into one
labelled answer as a run judges a record. Every problem of the file is reported as
`file:line: field: message`."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cts.eval.data.dataset import SAMPLE_DIR, field_problems, labelled_rows, refuse_labels
from cts.eval.data.schema import known_language
from cts.eval.score.metrics import Label
from cts.webdancer.corpus import Problem

LABELS: tuple[Label, ...] = ("full", "partial", "none")
#: The labelled set shipped with the toolkit (`--labels sample`).
SAMPLE_LABELS = SAMPLE_DIR / "judge_labels.jsonl"

_REQUIRED = ("answer", "nugget", "label")
_OPTIONAL = ("id", "group", "nugget_id", "query", "language", "instance_id", "note")


# -- the labelled set -------------------------------------------------------------------------


@dataclass(frozen=True)
class LabelledNugget:
    #: What the judge's output schema keys this nugget by (unique within its answer).
    id: str
    text: str
    #: The people's label.
    label: Label
    line: int


@dataclass(frozen=True)
class LabelledAnswer:
    group: str
    answer: str
    language: str
    query: str | None
    nuggets: tuple[LabelledNugget, ...]


@dataclass(frozen=True)
class LabelSet:
    path: str
    answers: tuple[LabelledAnswer, ...]

    @property
    def pairs(self) -> int:
        return sum(len(a.nuggets) for a in self.answers)


def labels_path(labels: str | Path) -> Path:
    """`sample` is the shipped set; anything else a path."""
    return SAMPLE_LABELS if str(labels) == "sample" else Path(labels).expanduser()


#: (field, message) of one problem in a row.
Found = tuple[str, str]


def _text(data: dict[str, Any], key: str, problems: list[Found], *, empty: bool = False) -> None:
    value = data.get(key)
    if not isinstance(value, str):
        problems.append((key, f"must be a string, got {type(value).__name__}"))
    elif not empty and not value.strip():
        problems.append((key, "empty"))


def read_labels(labels: str | Path) -> LabelSet:
    """Every row of a labels JSONL, grouped by answer; DatasetError listing every bad row as
    `file:line: field: message`."""
    path = labels_path(labels)
    file = str(path)
    labelled, problems = labelled_rows(path, _row_problems)
    groups: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for line, data in labelled:
        groups.setdefault(data.get("group") or data["answer"], []).append((line, data))
    answers = []
    for group, rows in groups.items():
        answer, mismatches = _answer(group, rows)
        problems += [Problem(file, line, key, message) for line, key, message in mismatches]
        answers.append(answer)
    refuse_labels(file, problems, len(answers))
    return LabelSet(file, tuple(answers))


def _row_problems(data: dict[str, Any], ids: dict[str, int], line: int) -> list[Found]:
    problems = field_problems(data, _REQUIRED, _OPTIONAL)
    if "answer" in data:
        _text(data, "answer", problems, empty=True)  # an empty answer is one a run can give
    if "nugget" in data:
        _text(data, "nugget", problems)
    if "label" in data and data["label"] not in LABELS:
        problems.append(("label", f"must be one of {', '.join(LABELS)}, got {data['label']!r}"))
    for key in ("id", "group", "nugget_id", "language", "instance_id"):
        if key in data:
            _text(data, key, problems)
    # As the answerer's labels: an unknown tag would be judged with the English prompt and
    # reported as a language of its own.
    language = data.get("language")
    if isinstance(language, str) and language.strip() and not known_language(language):
        problems.append(("language", f"unknown language {language!r} (an ISO 639-1 code)"))
    for key in ("query", "note"):
        if data.get(key) is not None:
            _text(data, key, problems, empty=True)
    row_id = data.get("id")
    if isinstance(row_id, str) and row_id.strip():
        if row_id in ids:
            problems.append(("id", f"duplicate: {row_id!r} is also on line {ids[row_id]}"))
        else:
            ids[row_id] = line
    return problems


def _answer(
    group: str, rows: list[tuple[int, dict[str, Any]]]
) -> tuple[LabelledAnswer, list[tuple[int, str, str]]]:
    """One answer from its rows; the rows must agree on what the judge is shown."""
    first_line, first = rows[0]
    problems: list[tuple[int, str, str]] = []
    nuggets: list[LabelledNugget] = []
    seen: dict[str, int] = {}
    # Rows without a nugget_id get n1, n2, … (as gold nuggets are named), skipping given ones.
    given = {data["nugget_id"] for _, data in rows if "nugget_id" in data}
    unnamed = (f"n{k}" for k in itertools.count(1) if f"n{k}" not in given)
    for line, data in rows:
        for key, default in (("answer", None), ("query", None), ("language", "en")):
            if data.get(key, default) != first.get(key, default):
                problems.append(
                    (
                        line,
                        key,
                        f"differs from line {first_line} of the same answer (group "
                        f"{group[:60]!r}); rows of one answer share answer, query and language",
                    )
                )
        nugget_id = data["nugget_id"] if "nugget_id" in data else next(unnamed)
        if nugget_id in seen:
            problems.append(
                (
                    line,
                    "nugget_id",
                    f"duplicate in this answer: {nugget_id!r} is also on line {seen[nugget_id]}",
                )
            )
        seen.setdefault(nugget_id, line)
        nuggets.append(LabelledNugget(nugget_id, data["nugget"], data["label"], line))
    query = first.get("query")
    answer = LabelledAnswer(
        group=group,
        answer=first["answer"],
        language=first.get("language", "en"),
        query=query if isinstance(query, str) and query.strip() else None,
        nuggets=tuple(nuggets),
    )
    return answer, problems
