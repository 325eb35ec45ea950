"""Reading benchmark instances and corpora from JSONL, JSON, CSV, Parquet or anything
`datasets.load_dataset` reads (the rows: cts/eval/data/readers.py), adapting foreign column
names, and validating every row.

Validation reports every problem, not the first, as `file:line: field: message`; a loader that
finds any problem raises `DatasetError` with all of them. Rows from Parquet and `datasets`
sources have no text lines: their "line" is the 1-based row number.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cts.eval.data.readers import (
    DatasetError,
    Row,
    expanded_path,
    read_rows,
)
from cts.eval.data.schema import CONSTRAINT_TYPES, CorpusDocument, Instance, known_language
from cts.webdancer.corpus import Problem, check_corpus
from cts.webdancer.corpus import load_corpus as load_corpus_file

#: The sample benchmark shipped with the package.
SAMPLE_DIR = Path(__file__).resolve().parents[1] / "sample_data"
SAMPLE_SPLITS = ("dev", "test", "train")


class GoldTable(BaseModel):
    """A separate table of golden nuggets joined to the queries by id."""

    model_config = ConfigDict(extra="forbid")
    path: str
    #: The column holding the instance id in the gold table.
    id_field: str = "id"
    #: The column holding a list of nuggets; when absent from a row, the row is one nugget.
    nuggets_field: str = "nuggets"
    #: Our nugget field → the gold table's name for it.
    nugget_field_map: dict[str, str] = {}
    #: Labels to weights, for gold tables that grade importance with words (vital: 2, okay: 1).
    weight_map: dict[str, float] = {}


class DatasetSource(BaseModel):
    """Where instances come from and how their fields are named (experiment `dataset:`)."""

    model_config = ConfigDict(extra="forbid")
    #: `sample` (the shipped benchmark), a file, a folder, or a `datasets` hub id.
    path: str = "sample"
    split: str | None = "dev"
    #: Only the first N instances (None: all of them).
    limit: int | None = Field(None, ge=1)
    #: Our field → the dataset's column (dotted for nested: `intent.full`).
    field_map: dict[str, str] = {}
    gold: GoldTable | None = None
    #: Corpus whose doc ids nugget `source_ids` must exist in (`sample` = the shipped corpus).
    corpus: str | None = None


# -- reading rows ---------------------------------------------------------------------------------


#: A labels file's check of one row: its problems as (field, message), given the row's data,
#: the ids of the rows before it (id -> line; the check records the row's) and its line.
RowCheck = Callable[[dict[str, Any], dict[str, int], int], list[tuple[str, str]]]


def field_problems(
    data: dict[str, Any], required: Sequence[str], optional: Sequence[str]
) -> list[tuple[str, str]]:
    """A labels row's fields that are unknown or missing, as (field, message)."""
    known = (*required, *optional)
    problems = [
        (k, f"unknown field (expected one of {', '.join(known)})") for k in data if k not in known
    ]
    return problems + [(k, "missing") for k in required if k not in data]


def labelled_rows(
    path: Path, check: RowCheck
) -> tuple[list[tuple[int, dict[str, Any]]], list[Problem]]:
    """The rows of a labels JSONL that `check` finds nothing wrong with, each with its line,
    and the problems of the others; DatasetError at once for a file that is missing or not
    JSONL."""
    file = str(path)
    if not path.is_file():
        raise DatasetError([Problem(file, None, "<file>", "no such file")])
    if path.suffix not in (".jsonl", ".ndjson"):
        raise DatasetError([Problem(file, None, "<file>", "expected a JSONL file (.jsonl)")])
    problems: list[Problem] = []
    rows: list[tuple[int, dict[str, Any]]] = []
    ids: dict[str, int] = {}
    for row in read_rows(path):
        if row.data is None:
            problems.append(Problem(file, row.line, "<row>", row.error or "unreadable"))
            continue
        found = check(row.data, ids, row.line)
        problems += [Problem(file, row.line, key, message) for key, message in found]
        if not found:
            rows.append((row.line, row.data))
    return rows, problems


def refuse_labels(file: str, problems: list[Problem], labelled: int) -> None:
    """DatasetError listing `problems`, or saying that the file has no labelled row."""
    if not problems and not labelled:
        problems.append(Problem(file, None, "<file>", "no labelled rows"))
    if problems:
        raise DatasetError(problems)


# -- adapting foreign shapes ----------------------------------------------------------------------


def _get(data: dict[str, Any], dotted: str) -> Any:
    value: Any = data
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _maybe_json(value: Any) -> Any:
    """CSV cells hold lists and objects as JSON text."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):  # also an integer too long for int()
            return value  # kept as text: validation reports the field
    return value


def _blank(value: Any) -> bool:
    """An empty (or all-space) text cell, which means "absent"."""
    return isinstance(value, str) and not value.strip()


_INSTANCE_FIELDS = set(Instance.model_fields)
_REQUIRED = {"id", "blurred_query", "fused_query"}

#: Other names datasets give our fields that are too unlike them for difflib (ratio < 0.8).
_ALIASES = {
    "golden_nuggets": "golden",
    "gold_nuggets": "golden",
    "nuggets": "golden",
    "lang": "language",
    "constraints": "removed_constraints",
}
#: How alike (difflib ratio) an unknown column and a field the row lacks must be for the
#: column to be taken for a misspelling: "langauge" 0.88, "removed_constraint" 0.97,
#: "gold" 0.8; unrelated extra columns ("category", "source") are far below. A column that
#: is something else by a near name is renamed (the message says so).
_TYPO_CUTOFF = 0.8


def _meant(key: str, lacking: list[str]) -> str | None:
    """The field of `lacking` that the column `key` most likely misspells, or None."""
    name = key.casefold()
    alias = _ALIASES.get(name)
    if alias in lacking:
        return alias
    close = difflib.get_close_matches(name, lacking, n=1, cutoff=_TYPO_CUTOFF)
    return close[0] if close else None


def misspelled_fields(
    data: dict[str, Any], adapted: dict[str, Any], field_map: dict[str, str]
) -> list[tuple[str, str]]:
    """The columns of the row `data` that look like a misspelt field (field, message).

    Unknown columns are carried into `meta`, as foreign datasets have many; but one that is
    close to a field the adapted row lacks would silently change the run (`langauge`: a
    Chinese row prompted in English; `golden_nuggets`: an instance never scored)."""
    mapped = {source.split(".")[0] for source in field_map.values()}
    # meta is a free-form bag: a near miss of it only nests, so it is never suggested.
    lacking = sorted(_INSTANCE_FIELDS - {"meta"} - set(adapted))
    found = []
    for key, value in data.items():
        if key in _INSTANCE_FIELDS or key in mapped or key == "meta" or value in (None, ""):
            continue  # a field, a mapped column, or an empty cell that carries nothing
        meant = _meant(key, lacking)
        if meant is not None:
            found.append(
                (
                    key,
                    f'unknown field; did you mean "{meant}"? (rename the column, or map it: '
                    f"--set dataset.field_map.{meant}={key})",
                )
            )
    return found


def adapt_instance(data: dict[str, Any], field_map: dict[str, str]) -> dict[str, Any]:
    """Rename mapped columns, parse JSON-in-cells, and keep unknown columns under `meta`."""
    mapped_sources = {source.split(".")[0] for source in field_map.values()}
    out: dict[str, Any] = {ours: _get(data, theirs) for ours, theirs in field_map.items()}
    given = _maybe_json(data.get("meta")) if "meta" not in field_map else None
    meta = dict(given) if isinstance(given, dict) else {}
    for key, value in data.items():
        if key in out or key in mapped_sources or key == "meta":
            continue
        if key in _INSTANCE_FIELDS:
            out[key] = value
        elif value not in (None, ""):
            meta[key] = value
    if given is not None and not isinstance(given, dict) and not _blank(given):
        out["meta"] = given  # not an object: the schema reports `meta` for this row
    elif meta:
        out["meta"] = meta
    for key in ("golden", "removed_constraints"):
        out[key] = _maybe_json(out.get(key))
    constraints = out.get("removed_constraints")
    if isinstance(constraints, str):
        out["removed_constraints"] = [
            c.strip() for c in re.split(r"[;,|]", constraints) if c.strip()
        ]
    for key in ("id", "blurred_query", "fused_query", "language"):
        if isinstance(out.get(key), (int, float)) and not isinstance(out.get(key), bool):
            out[key] = str(out[key])
    # An empty optional cell means "absent"; an empty required one is reported as empty.
    return {k: v for k, v in out.items() if v is not None and (v != "" or k in _REQUIRED)}


def _adapt_nugget(raw: Any, table: GoldTable) -> Any:
    if not isinstance(raw, dict):
        return raw
    nugget = {ours: raw.get(theirs) for ours, theirs in table.nugget_field_map.items()}
    for key in ("id", "text", "weight", "source_ids"):
        if key not in nugget and key in raw:
            nugget[key] = raw[key]
    weight = nugget.get("weight")
    if isinstance(weight, str) and weight in table.weight_map:
        nugget["weight"] = table.weight_map[weight]
    if isinstance(nugget.get("source_ids"), str):
        nugget["source_ids"] = _maybe_json(nugget["source_ids"])
    if isinstance(nugget.get("id"), int):
        nugget["id"] = str(nugget["id"])
    return {k: v for k, v in nugget.items() if v is not None}


def read_gold(
    table: GoldTable, base: Path | None = None
) -> tuple[dict[str, list[Any]], list[Problem]]:
    """Gold table → {instance id: [nugget dicts]} (wide: one row per instance with a list;
    long: one row per nugget)."""
    nuggets, _, problems = _read_gold(table)
    return nuggets, problems


def _read_gold(
    table: GoldTable,
) -> tuple[dict[str, list[Any]], dict[str, tuple[str, int]], list[Problem]]:
    """`read_gold`, and where each id is first seen (file, line) for the join's problems."""
    path = expanded_path(table.path)
    nuggets: dict[str, list[Any]] = {}
    where: dict[str, tuple[str, int]] = {}
    problems: list[Problem] = []
    for row in read_rows(path):
        if row.data is None:
            problems.append(Problem(row.file, row.line, "<row>", row.error or "unreadable"))
            continue
        key = row.data.get(table.id_field)
        if key in (None, ""):
            problems.append(Problem(row.file, row.line, table.id_field, "missing"))
            continue
        listed = _maybe_json(row.data.get(table.nuggets_field))
        items = listed if isinstance(listed, list) else [row.data]
        nuggets.setdefault(str(key), []).extend(_adapt_nugget(n, table) for n in items)
        where.setdefault(str(key), (row.file, row.line))
    return nuggets, where, problems


# -- validation -----------------------------------------------------------------------------------


def _pydantic_problems(e: ValidationError, file: str, line: int) -> list[Problem]:
    problems = []
    for err in e.errors():
        loc = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in err["loc"]).replace(
            ".[", "["
        )
        kind = err["type"]
        if kind == "removed_span":  # raised on the whole instance, about one of its spans
            loc = err["ctx"]["field"]
        if kind == "missing":
            message = "missing"
        elif kind == "string_too_short":
            message = "empty"
        elif kind == "extra_forbidden":
            message = "unknown field"
        elif kind == "literal_error" and err["loc"][0] == "removed_constraints":
            given = (
                "not a {type, span} object with two strings"
                if isinstance(err["input"], dict)
                else f"unknown constraint type {err['input']!r}"
            )
            message = f"{given} (expected one of {', '.join(CONSTRAINT_TYPES)})"
        elif loc.endswith(".weight"):
            message = f"must be a number > 0 and at most 1e6, got {err['input']!r}"
        else:
            message = err["msg"]
        problems.append(Problem(file, line, loc or "<row>", message))
    return problems


@dataclass
class Checked:
    """Valid instances (in input order) and every problem found."""

    instances: list[Instance] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    #: Where each valid instance came from, for later error messages.
    origin: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: The id of every row that has one, valid or not (the gold join's other side).
    ids: set[str] = field(default_factory=set)
    #: Rows left out for their problems (a row may have several problems).
    invalid_rows: int = 0


def check_instances(
    rows: Iterable[Row],
    field_map: dict[str, str] | None = None,
    gold: dict[str, list[Any]] | None = None,
    corpus_ids: set[str] | None = None,
    corpus_label: str = "the corpus",
    gold_label: str = "the gold table",
) -> Checked:
    checked = Checked()
    first_seen: dict[str, int] = {}
    for row in rows:
        if row.data is None:
            checked.problems.append(Problem(row.file, row.line, "<row>", row.error or "unreadable"))
            checked.invalid_rows += 1
            continue
        data = adapt_instance(row.data, field_map or {})
        missing_gold: list[Problem] = []
        if "id" in data and not _blank(data["id"]):
            checked.ids.add(str(data["id"]))
            if gold is not None and str(data["id"]) in gold:
                data["golden"] = {"nuggets": gold[str(data["id"])]}
            elif gold is not None and data.get("golden") is None:
                # A join that matches nothing would otherwise run every model call unscored.
                message = f"no gold row with id {str(data['id'])!r} in {gold_label}"
                missing_gold.append(Problem(row.file, row.line, "golden", message))
        # After the gold join: a row whose golden comes from the gold table lacks no golden.
        misspelt = [
            Problem(row.file, row.line, key, message)
            for key, message in misspelled_fields(row.data, data, field_map or {})
        ]
        problems = misspelt + missing_gold
        problems += _row_problems(data, row, first_seen, corpus_ids, corpus_label)
        try:
            instance = Instance.model_validate(data)
        except ValidationError as e:
            problems += _pydantic_problems(e, row.file, row.line)
            instance = None
        checked.problems += problems
        checked.invalid_rows += bool(problems) or instance is None
        if instance is not None and not problems:
            checked.instances.append(instance)
            checked.origin[instance.id] = (row.file, row.line)
    return checked


def _row_problems(
    data: dict[str, Any],
    row: Row,
    first_seen: dict[str, int],
    corpus_ids: set[str] | None,
    corpus_label: str,
) -> list[Problem]:
    """The rules pydantic cannot express: cross-field, cross-row and cross-file checks."""
    problems: list[Problem] = []

    def add(where: str, message: str) -> None:
        problems.append(Problem(row.file, row.line, where, message))

    for name in ("id", "blurred_query", "fused_query"):
        if isinstance(data.get(name), str) and not data[name].strip() and data[name] != "":
            add(name, "empty")  # whitespace only; "" is reported by the schema
    key = data.get("id")
    if isinstance(key, str) and key.strip():
        if key in first_seen:
            add("id", f"duplicate id {key!r} (first at line {first_seen[key]})")
        else:
            first_seen[key] = row.line
    blurred, fused = data.get("blurred_query"), data.get("fused_query")
    if isinstance(blurred, str) and blurred.strip() and blurred.strip() == str(fused).strip():
        add("blurred_query", "equal to fused_query")
    language = data.get("language")
    if isinstance(language, str) and language and not known_language(language):
        add("language", f"unknown language {language!r} (expected an ISO 639-1 code)")
    golden = data.get("golden")
    nuggets = golden.get("nuggets") if isinstance(golden, dict) else None
    if isinstance(nuggets, list):
        seen: set[str] = set()
        for i, nugget in enumerate(nuggets):
            if not isinstance(nugget, dict):
                continue
            where = f"golden.nuggets[{i}]"
            nugget_id = nugget.get("id")
            if isinstance(nugget_id, str):
                if nugget_id in seen:
                    add(f"{where}.id", f"duplicate nugget id {nugget_id!r}")
                seen.add(nugget_id)
            sources = nugget.get("source_ids")
            if corpus_ids is not None and isinstance(sources, list):
                for source in sources:
                    if str(source) not in corpus_ids:
                        add(f"{where}.source_ids", f"{source!r} not in {corpus_label}")
    return problems


# -- the loaders the rest of the toolkit calls ----------------------------------------------------


def sample_path(split: str) -> Path:
    if split not in SAMPLE_SPLITS:
        raise DatasetError(
            [
                Problem(
                    "sample",
                    None,
                    "split",
                    f"unknown split {split!r} (the sample has {', '.join(SAMPLE_SPLITS)})",
                )
            ]
        )
    return SAMPLE_DIR / f"{split}.jsonl"


def sample_sources(split: str | None = None) -> list[DatasetSource]:
    """What `sample` is to the golden commands (audit, export, import): the shipped sample's
    `split`, or every split of it (SAMPLE_SPLITS, train included), as one file source each.
    DatasetError for a split the sample does not have."""
    splits = [split] if split else SAMPLE_SPLITS
    return [DatasetSource(path=str(sample_path(s)), split=None) for s in splits]


def corpus_path(corpus: str) -> Path:
    return SAMPLE_DIR / "corpus.jsonl" if corpus == "sample" else expanded_path(corpus)


def load_corpus(corpus: str) -> list[CorpusDocument]:
    """`sample` or a corpus JSONL path; CorpusError lists every problem."""
    return load_corpus_file(corpus_path(corpus))


def corpus_ids(corpus: str) -> set[str]:
    """Doc ids of a corpus's valid documents (validating the corpus is its own check)."""
    return {d.doc_id for d in check_corpus(corpus_path(corpus))[0]}


def _source_rows(source: DatasetSource) -> Iterator[Row]:
    if source.path == "sample":
        splits = [source.split] if source.split else ["dev", "test"]
        for split in splits:
            yield from read_rows(sample_path(split))
    else:
        yield from read_rows(source.path, source.split)


def check_source(source: DatasetSource) -> Checked:
    """Read and validate every row of a dataset source (gold join and corpus check included)."""
    gold = None
    gold_where: dict[str, tuple[str, int]] = {}
    gold_problems: list[Problem] = []
    gold_label = "the gold table"
    if source.gold is not None:
        gold, gold_where, gold_problems = _read_gold(source.gold)
        gold_label = str(expanded_path(source.gold.path))
    corpus = source.corpus or ("sample" if source.path == "sample" else None)
    ids = corpus_ids(corpus) if corpus else None
    label = f"corpus {corpus_path(corpus)}" if corpus else "the corpus"
    checked = check_instances(
        _source_rows(source), source.field_map, gold, ids, label, gold_label=gold_label
    )
    if source.gold is not None:
        id_field = source.gold.id_field
        for key, (file, line) in gold_where.items():
            if key not in checked.ids:
                message = f"gold id {key!r} matches no query id in {source.path}"
                gold_problems.append(Problem(file, line, id_field, message))
    if not checked.instances and not checked.problems:
        # No rows at all (an empty file, a header only): not "OK", and not an empty run.
        checked.problems.append(Problem(source.path, None, "<dataset>", "no instances"))
    checked.problems = gold_problems + checked.problems
    return checked


def load_instances(source: DatasetSource) -> list[Instance]:
    """Every instance of `source` (first `limit`), or DatasetError listing every problem."""
    checked = check_source(source)
    if checked.problems:
        raise DatasetError(checked.problems)
    instances = checked.instances
    return instances[: source.limit] if source.limit else instances
