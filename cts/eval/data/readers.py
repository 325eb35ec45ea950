"""Reading rows from JSONL, JSON, CSV/TSV, Parquet or anything `datasets.load_dataset` reads, each
row with its file and line (Parquet and `datasets` rows: the 1-based row number) or why it could
not be read at all (malformed JSON or CSV, a bad byte), so that validation reports every problem
as `file:line: field: message`."""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cts.webdancer.corpus import Problem, ProblemsError

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


#: Text files are read with errors="surrogateescape", so that a bad byte is reported on its
#: line (instead of a UnicodeDecodeError for the whole file); it reads as U+DC80..U+DCFF.
_BAD_BYTE = re.compile("[\udc80-\udcff]")
#: json.loads raises RecursionError (not JSONDecodeError) for JSON nested ~1000 deep.
_TOO_DEEP = "malformed JSON: nested too deeply"
#: ...and a plain ValueError for an integer longer than int() converts (4300 digits).
_TOO_LONG = "malformed JSON: a number with too many digits"


def expanded_path(path: str | Path) -> Path:
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
    path = expanded_path(source)
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
