"""Reading benchmark instances and corpora from JSONL, JSON, CSV, Parquet or anything
`datasets.load_dataset` reads, adapting foreign column names, and validating every row.

Validation reports every problem, not the first, as `file:line: field: message`; a loader that
finds any problem raises `DatasetError` with all of them. Rows from Parquet and `datasets`
sources have no text lines: their "line" is the 1-based row number.
"""

from __future__ import annotations

import csv
import difflib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cts.eval.data.schema import CONSTRAINT_TYPES, CorpusDocument, Instance, known_language
from cts.webdancer.corpus import Problem, ProblemsError, check_corpus
from cts.webdancer.corpus import load_corpus as load_corpus_file

#: The sample benchmark shipped with the package.
SAMPLE_DIR = Path(__file__).resolve().parents[1] / "sample_data"
SAMPLE_SPLITS = ("dev", "test", "train")
_NATIVE = {".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet"}


class DatasetError(ProblemsError):
    """Bad dataset input; `problems` lists every one as `file:line: field: message`."""


@dataclass
class Row:
    file: str
    line: int
    data: dict[str, Any] | None
    #: Why the row could not be read at all (malformed JSON or CSV).
    error: str | None = None


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

#: Text files are read with errors="surrogateescape", so that a bad byte is reported on its
#: line (instead of a UnicodeDecodeError for the whole file); it reads as U+DC80..U+DCFF.
_BAD_BYTE = re.compile("[\udc80-\udcff]")
#: json.loads raises RecursionError (not JSONDecodeError) for JSON nested ~1000 deep.
_TOO_DEEP = "malformed JSON: nested too deeply"
#: ...and a plain ValueError for an integer longer than int() converts (4300 digits).
_TOO_LONG = "malformed JSON: a number with too many digits"


def _expanded(path: str | Path) -> Path:
    """`path` with `~` expanded, or as written when it names no known home (`~nobody/x`,
    for which expanduser raises RuntimeError): then it is reported as not found."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        return Path(path)


def _utf8_error(text: str) -> str | None:
    """Why `text` (read with surrogateescape) is not valid UTF-8, or None."""
    bad = _BAD_BYTE.search(text)
    return None if bad is None else f"not valid UTF-8 (byte 0x{ord(bad.group()) - 0xDC00:02x})"


#: Text files that are not CSV are read as utf-8-sig too: editors and exports on Windows begin
#: them with a BOM, which json.loads refuses ("Unexpected UTF-8 BOM") on the first row only.
#: The codec strips it at the start of the file alone; one further on stays a problem.
_TEXT_ENCODING = "utf-8-sig"


def _jsonl_rows(path: Path) -> Iterator[Row]:
    with path.open(encoding=_TEXT_ENCODING, errors="surrogateescape") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            bad = _utf8_error(line)
            if bad is not None:
                yield Row(str(path), n, None, bad)
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                yield Row(str(path), n, None, f"malformed JSON: {e.msg} (column {e.colno})")
                continue
            except RecursionError:
                yield Row(str(path), n, None, _TOO_DEEP)
                continue
            except ValueError:
                yield Row(str(path), n, None, _TOO_LONG)
                continue
            if not isinstance(data, dict):
                yield Row(str(path), n, None, f"expected a JSON object, got {type(data).__name__}")
                continue
            yield Row(str(path), n, data)


def _item_starts(text: str, key: str | None) -> list[int]:
    """Where each element of the top-level array of `text` (already parsed) starts, or of the
    array under `key` of its top-level object, to report each element's own line (an
    element's index would name a wrong line of a file laid out on one or many lines)."""
    decoder = json.JSONDecoder()

    def skip(i: int, chars: str = " \t\r\n") -> int:
        while text[i] in chars:
            i += 1
        return i

    i = skip(0)
    if key is not None:
        start = i
        i += 1  # past "{"
        while text[i := skip(i, " \t\r\n,")] != "}":
            name, i = decoder.raw_decode(text, i)
            i = skip(skip(i) + 1)  # past ":"
            if name == key:
                start = i  # the last one: json.loads keeps the last of repeated keys
            _, i = decoder.raw_decode(text, i)
        i = start
    starts = []
    i += 1  # past "["
    while text[i := skip(i, " \t\r\n,")] != "]":
        starts.append(i)
        _, i = decoder.raw_decode(text, i)
    return starts


def _json_rows(path: Path) -> Iterator[Row]:
    """A JSON array of objects (or {"data"|"instances": [...]}), with each object's line."""
    text = path.read_text(encoding=_TEXT_ENCODING, errors="surrogateescape")
    bad = _BAD_BYTE.search(text)
    if bad is not None:
        line = text.count("\n", 0, bad.start()) + 1
        yield Row(str(path), line, None, _utf8_error(bad.group()))
        return
    try:
        whole = json.loads(text)
    except json.JSONDecodeError as e:
        yield Row(str(path), e.lineno, None, f"malformed JSON: {e.msg} (column {e.colno})")
        return
    except RecursionError:
        yield Row(str(path), 1, None, _TOO_DEEP)
        return
    except ValueError:
        yield Row(str(path), 1, None, _TOO_LONG)
        return
    key = None
    if isinstance(whole, dict):
        key = next(
            (k for k in ("instances", "data", "rows") if isinstance(whole.get(k), list)), None
        )
        if key is None:
            yield Row(str(path), 1, None, "expected a JSON array of objects")
            return
        whole = whole[key]
    if not isinstance(whole, list):
        yield Row(str(path), 1, None, "expected a JSON array of objects")
        return
    starts = _item_starts(text, key)
    for k, item in enumerate(whole):
        line = text.count("\n", 0, starts[k]) + 1
        if not isinstance(item, dict):
            yield Row(str(path), line, None, f"expected a JSON object, got {type(item).__name__}")
            continue
        yield Row(str(path), line, item)


def _csv_header_error(header: list[str]) -> str | None:
    """Why a CSV header cannot name the columns, or None."""
    bad = _utf8_error("".join(header))
    if bad is not None:
        return f"malformed CSV header: {bad}"
    seen: set[str] = set()
    for name in header:
        if name in seen:
            # Rows become dicts, so a repeated column would silently keep its last cell.
            return f"malformed CSV header: duplicate column {name!r}"
        seen.add(name)
    return None


def _csv_rows(path: Path) -> Iterator[Row]:
    delimiter = "\t" if path.suffix == ".tsv" else ","
    # utf-8-sig: spreadsheet exports often begin with a BOM, which would stick to the first
    # column's name ("\ufeffid") and make every row's id "missing".
    with path.open(encoding="utf-8-sig", errors="surrogateescape", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            yield Row(str(path), 1, None, f"malformed CSV header: {e}")
            return
        header_error = _csv_header_error(header)
        if header_error is not None:
            yield Row(str(path), 1, None, header_error)
            return
        while True:
            start = reader.line_num + 1
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                yield Row(str(path), start, None, f"malformed CSV row: {e}")
                continue
            if not any(c.strip() for c in cells):
                continue
            bad = _utf8_error("".join(cells))
            if bad is not None:
                yield Row(str(path), start, None, bad)
                continue
            if len(cells) != len(header):
                yield Row(
                    str(path),
                    start,
                    None,
                    f"malformed CSV row: expected {len(header)} fields, got {len(cells)}",
                )
                continue
            yield Row(str(path), start, dict(zip(header, cells, strict=True)))


def _table_rows(label: str, records: Iterable[dict[str, Any]]) -> Iterator[Row]:
    for n, record in enumerate(records, 1):
        yield Row(label, n, dict(record))


def _parquet_rows(path: Path) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        # A file named .parquet that is not one (or is truncated): a problem, not a traceback.
        raise DatasetError(
            [Problem(str(path), None, "<file>", f"not a readable Parquet file: {e}")]
        ) from e
    yield from _table_rows(str(path), table.to_pylist())


def _hf_rows(source: str, split: str | None) -> Iterator[Row]:
    """A local folder or a hub id through `datasets` (HF_DATASETS_OFFLINE/HF_HUB_OFFLINE
    are honoured: offline, only what is already in the local cache loads)."""
    import datasets

    try:
        loaded = datasets.load_dataset(source, split=split or "train")
    except Exception as e:  # datasets raises many types; the message is what matters
        offline = os.environ.get("HF_DATASETS_OFFLINE") or os.environ.get("HF_HUB_OFFLINE")
        hint = " (offline mode is on: only locally cached datasets load)" if offline else ""
        raise DatasetError(
            [Problem(source, None, "<dataset>", f"datasets.load_dataset failed: {e}{hint}")]
        ) from e
    yield from _table_rows(source, loaded)


def read_rows(source: str | Path, split: str | None = None) -> Iterator[Row]:
    path = _expanded(source)
    try:
        if path.is_file() and path.suffix in _NATIVE:
            readers = {
                ".jsonl": _jsonl_rows,
                ".ndjson": _jsonl_rows,
                ".json": _json_rows,
                ".csv": _csv_rows,
                ".tsv": _csv_rows,
                ".parquet": _parquet_rows,
            }
            yield from readers[path.suffix](path)
        elif path.is_dir():
            yield from _hf_rows(str(path), split)  # expanded: `datasets` does not expand `~`
        elif (
            not path.exists()
            and path.suffix not in _NATIVE
            and re.fullmatch(r"[\w.-]+/[\w.-]+", str(source))
        ):
            # owner/name is a hub id; data/queries.jsonl that is not there is a missing file,
            # not a hub lookup that retries for half a minute before failing.
            yield from _hf_rows(str(source), split)
        elif path.is_file():
            yield from _hf_rows(str(path), split)
        else:
            raise DatasetError([Problem(str(path), None, "<file>", "no such file or folder")])
    except OSError as e:
        # pathlib ignores only "no such file": a name too long for the file system, or a file
        # that cannot be read (permission denied), would otherwise end in a traceback.
        raise DatasetError(
            [Problem(str(path), None, "<file>", f"cannot read: {e.strerror or e}")]
        ) from e


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
    path = _expanded(table.path)
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
    return SAMPLE_DIR / "corpus.jsonl" if corpus == "sample" else _expanded(corpus)


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
        gold_label = str(_expanded(source.gold.path))
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
