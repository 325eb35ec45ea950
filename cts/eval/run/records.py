"""A run's records on disk: one JSONL line per finished key in
records/<condition>/shard-<i>-of-<n>.jsonl, read back, checked line by line, and merged across
shards. Every reader of a run (the report, merge, the viewer, estimate, Slurm status, the
training loop) needs this and nothing of how keys are run (cts/eval/run/runner.py), so it is a
module of its own. Appends are fsync'd one line at a time; a torn last line (a crash mid-write) is
skipped by readers and cut off only by that shard's next writer."""

from __future__ import annotations

import json
import math
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from cts.eval.data.schema import Instance, Record
from cts.eval.run.bulk import collector_paused
from cts.eval.run.run_dir import RunDir, Shard
from cts.foundation.disk import append_line, write_whole

Key = tuple[str, str, int]


class RecordFileError(ValueError):
    """A complete line of a records file is not a record (file:line: why)."""


M = TypeVar("M", bound=BaseModel)


def parse_jsonl(
    path: Path, data: bytes, model: type[M], what: str, error: type[ValueError]
) -> tuple[list[M], int]:
    """The `model` rows of a JSONL file's bytes, and how many bytes the complete lines take (a
    torn last line, a crash mid-write, is left out). Any other line that is not a row is
    `error`, naming the file, line and field: someone edited or corrupted the file, and a run
    must stop rather than silently re-run or drop keys."""
    rows: list[M] = []
    complete = len(data)
    with collector_paused():  # thousands of acyclic records: see cts/eval/run/bulk.py
        for n, line in enumerate(data.splitlines(keepends=True), 1):
            if not line.endswith(b"\n"):
                complete -= len(line)
                break
            try:
                rows.append(model.model_validate_json(line))
            except ValidationError as e:
                problem = e.errors()[0]
                where = ".".join(str(x) for x in problem["loc"])
                raise error(
                    f"{path}:{n}: {where + ': ' if where else ''}{problem['msg']} — "
                    f"not {what}; fix or remove the line, then run again"
                ) from None
    return rows, complete


#: What every failed record's `error` names, in every version (cts/eval/run/pipeline.py `_stage`):
#: the report counts failures by them.
ERROR_KEYS = ("kind", "stage")


def _not_a_record(record: Record) -> str | None:
    """`field: why` for what the schema lets through but no record of the toolkit holds (a
    hand-edited or foreign line), which the report would otherwise read as a bare KeyError."""
    for name, value in record.scores.items():
        if not math.isfinite(value):
            return f"scores.{name}: {value} is not a finite number"
    for key in ERROR_KEYS:
        if record.error is not None and key not in record.error:
            return f"error.{key}: missing (a failed record names its {' and '.join(ERROR_KEYS)})"
    for nugget, judged in record.labels.items():
        if "label" not in judged:
            return f"labels.{nugget}.label: missing (full, partial or none)"
    return None


def parse_records(path: Path, data: bytes) -> tuple[list[Record], int]:
    """A records file's records (see `parse_jsonl`). A score that is NaN or infinite (JSON
    reads `NaN` and `Infinity`: a hand-edited or foreign line) is a RecordFileError naming the
    file and line: no statistic of the report means anything with it, and some never end. So
    is a failed record's error without its kind or stage, and a nugget's label entry without
    its label."""
    records, complete = parse_jsonl(path, data, Record, "a record", RecordFileError)
    for n, record in enumerate(records, 1):  # one record a line: parse_jsonl skips none
        problem = _not_a_record(record)
        if problem is not None:
            raise RecordFileError(
                f"{path}:{n}: {problem} — not a record; fix or remove the line, then run again"
            )
    return records, complete


class RecordStore:
    def __init__(self, run_dir: Path) -> None:
        self.root = RunDir(run_dir).records
        self._lock = threading.Lock()

    def path(self, condition: str, shard: Shard) -> Path:
        return self.root / condition / f"{shard.name}.jsonl"

    def append(self, record: Record, shard: Shard) -> None:
        """One line, fsync'd. A full disk raises StorageFull and leaves no torn line: the run
        stops, and the key runs again on resume."""
        path = self.path(record.condition, shard)
        with self._lock:
            append_line(path, (record.model_dump_json() + "\n").encode())

    def read(self, path: Path) -> list[Record]:
        """Every complete record of one file; a torn last line (a crash mid-write) is skipped.
        Reading never writes: the file may be a live writer's shard, or read-only."""
        if not path.is_file():
            return []
        return parse_records(path, path.read_bytes())[0]

    def repair(self, path: Path) -> None:
        """Cut a torn last line off a file this process is about to append to, so the next
        record starts on a fresh line. Only a shard's own writer may call it (see run_keys)."""
        if not path.is_file():
            return
        data = path.read_bytes()
        complete = parse_records(path, data)[1]
        if complete < len(data):
            with self._lock, path.open("r+b") as f:
                f.truncate(complete)

    def all_files(self) -> list[Path]:
        return sorted(self.root.glob("*/shard-*.jsonl"))

    def completed_for(self, shard: Shard) -> dict[Key, Record]:
        """The records that can be this shard's keys: its own files, and those of the run's
        other shard counts (a run resumed resharded). Sibling shards of the same count hold
        other instances only, so they are not read: a broken sibling cannot stop this shard."""
        own_count = f"-of-{shard.count}"
        done: dict[Key, Record] = {}
        for path in self.all_files():
            if path.stem == shard.name or not path.stem.endswith(own_count):
                for record in self.read(path):
                    done[record.key] = counts_over(done.get(record.key), record)
        return done

    def completed(self, shard: Shard | None = None) -> dict[Key, Record]:
        """The record that counts for each key (see `counts_over`)."""
        done: dict[Key, Record] = {}
        for path in self.all_files():
            if shard is None or path.stem == shard.name:
                for record in self.read(path):
                    done[record.key] = counts_over(done.get(record.key), record)
        return done


class UnrecordedStore(RecordStore):
    """RUN_DIR/unrecorded/<condition>/shard-<i>-of-<n>.jsonl: what a key had done when the run
    stopped before its record was written (Ctrl-C, SIGTERM, a dead server) — its model calls so
    far, in `usage`. The key runs again on resume and finds those answers in the response cache,
    which count as no work: `cts estimate` counts them from here. Never read as done keys."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.root = RunDir(run_dir).root / "unrecorded"
        self._repaired: set[Path] = set()

    def append(self, record: Record, shard: Shard) -> None:
        path = self.path(record.condition, shard)
        if path not in self._repaired:
            # A crash of this shard's predecessor may have torn the last line: cut it first.
            self.repair(path)
            self._repaired.add(path)
        super().append(record, shard)


def counts_over(earlier: Record | None, record: Record) -> Record:
    """Of two records of one key, the one that counts: a success over a failure (the failure
    was retried with --retry-failed, or the success is the retry), else the later one."""
    if earlier is None or earlier.error is not None:
        return record
    return earlier if record.error is not None else record


@dataclass
class MergeReport:
    records: dict[Key, Record]
    missing: list[Key]
    duplicates: list[Key]

    @property
    def ok(self) -> bool:
        return not self.missing and not self.duplicates


def merge(
    store: RecordStore, instances: list[Instance], conditions: Iterable[str], seeds: Iterable[int]
) -> MergeReport:
    """Every expected key exactly once across all shard files. A failure that was retried is
    not a duplicate: only a key with two successful records is. Only the keys the config names
    are checked: a narrowed run keeps records outside it, which nothing reads (the report
    counts them in its NOTE), so their duplicates cannot make two answers of one key."""
    seen: Counter[Key] = Counter()
    records: dict[Key, Record] = {}
    for path in store.all_files():
        for record in store.read(path):
            seen[record.key] += record.error is None
            records[record.key] = counts_over(records.get(record.key), record)
    expected = [(i.id, c, s) for i in instances for c in conditions for s in seeds]
    return MergeReport(
        records={k: records[k] for k in expected if k in records},
        missing=[k for k in expected if k not in records],
        duplicates=sorted(k for k in expected if seen[k] > 1),
    )


def write_jsonl(path: Path, records: Iterable[Record]) -> None:
    """Whole or not at all (a full disk raises StorageFull)."""
    lines = (json.dumps(r.model_dump(mode="json"), ensure_ascii=False) + "\n" for r in records)
    write_whole(path, "".join(lines))
