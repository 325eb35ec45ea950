"""The rows of one benchmark-building step (`cts data fuse`, `cts data blur`), kept as golden
construction keeps its records: one JSONL file per shard under the step's folder, a line
fsync'd as each row is done, so that a killed or preempted run resumes where it stopped and
shards of a Slurm array write side by side. A row that failed (a model call) is kept with its
error; `retry_failed` runs it again, and the later row counts."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from cts.eval.run.locks import shard_count_lock, shard_lock
from cts.eval.run.progress import ShowProgress, progress
from cts.eval.run.records import parse_jsonl
from cts.eval.run.run_dir import Shard
from cts.foundation.disk import append_line, write_whole

#: The building steps, as `cts data` and `cts slurm submit --job` name them.
BUILD_STEPS = ("fuse", "blur")


class BuildFileError(ValueError):
    """A shard file line that is not a row (not a torn last line: an edited or corrupt file)."""


class BuildRow(BaseModel):
    """What every step's row has: its key and, when a model call failed, why."""

    key: str
    error: str | None = None


R = TypeVar("R", bound=BuildRow)


@dataclass(frozen=True)
class BuildControl:
    """How a building step goes over its rows."""

    #: The progress bar's title.
    name: str
    shard: Shard = field(default_factory=Shard)
    show_progress: ShowProgress = True
    retry_failed: bool = False
    #: Rows in flight at once.
    concurrency: int = 4


@dataclass(frozen=True)
class BuildOutcome:
    #: The shard's keys, those run now (the others had rows), and the shard's rows that are
    #: failures (run now or before: what --retry-failed would run).
    keys: int
    ran: int
    failed: int


class RowStore(Generic[R]):
    def __init__(self, root: Path, row: type[R]) -> None:
        self.root = root
        self.row = row
        self._lock = threading.Lock()

    def path(self, shard: Shard) -> Path:
        return self.root / f"{shard.name}.jsonl"

    def append(self, row: R, shard: Shard) -> None:
        with self._lock:
            append_line(self.path(shard), (row.model_dump_json() + "\n").encode())

    def _read(self, path: Path) -> tuple[list[R], int]:
        """The rows of one file and the bytes its complete lines take."""
        return parse_jsonl(path, path.read_bytes(), self.row, "a row", BuildFileError)

    def repair(self, shard: Shard) -> None:
        """Cut a torn last line off the shard's own file before appending to it."""
        path = self.path(shard)
        if path.is_file():
            complete = self._read(path)[1]
            if complete < path.stat().st_size:
                with self._lock, path.open("r+b") as f:
                    f.truncate(complete)

    def rows(self) -> dict[str, R]:
        """The row that counts for each key, over every shard file: a later row over an
        earlier failure, never a failure over a finished row."""
        done: dict[str, R] = {}
        for path in sorted(self.root.glob("shard-*.jsonl")):
            for row in self._read(path)[0]:
                earlier = done.get(row.key)
                if earlier is None or earlier.error is not None or row.error is None:
                    done[row.key] = row
        return done

    @property
    def keys_file(self) -> Path:
        """Every key of the step, in order: what `cts slurm status` counts shards against."""
        return self.root / "keys.json"

    def write_keys(self, keys: list[str]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_whole(self.keys_file, json.dumps(keys, ensure_ascii=False))

    def read_keys(self) -> list[str] | None:
        return json.loads(self.keys_file.read_text("utf-8")) if self.keys_file.is_file() else None

    def to_run(self, keys: list[str], shard: Shard, retry_failed: bool) -> list[str]:
        """The shard's keys that have no row yet (with `retry_failed`, also those that failed)."""
        done = self.rows()
        return [
            k
            for k in shard.select(keys)
            if k not in done or (retry_failed and done[k].error is not None)
        ]


#: Opens what the rows need (the engines) for a block, and gives the function that makes a key's
#: row.
OpenWork = Callable[[], AbstractAsyncContextManager[Callable[[str], Awaitable[R]]]]


async def run_rows(
    store: RowStore[R], keys: list[str], open_work: OpenWork[R], control: BuildControl
) -> BuildOutcome:
    """Run the shard's keys that have no row yet, `concurrency` at a time, each row appended
    as it is done; a progress bar or log lines as `show_progress` says. Nothing is opened when
    nothing is left to run: the unsharded pass after a Slurm array only writes the output."""
    shard = control.shard
    # One writer per shard file: a second (the same Slurm submit sent twice, a requeued task
    # beside its old self) would repair the file the first appends to and run every key
    # again into it; and one shard count at a time: another count splits the keys its own way
    # and made keys a live shard was making (10 of 19 done twice). Busy is ShardBusy, as
    # `cts run` says.
    with shard_lock(store.root, shard), shard_count_lock(store.root, shard):
        store.repair(shard)
        store.write_keys(keys)
        todo = store.to_run(keys, shard, control.retry_failed)
        mine = shard.select(keys)
        if todo:
            gate = asyncio.Semaphore(control.concurrency)
            show = control.show_progress
            async with (
                open_work() as work,
                progress(control.name, len(mine), len(mine) - len(todo), show, "rows") as done,
            ):

                async def one(key: str) -> None:
                    async with gate:
                        row = await work(key)
                    store.append(row, shard)
                    done(row.error is not None)

                await asyncio.gather(*(one(k) for k in todo))
    rows = store.rows()
    failed = sum(1 for k in mine if k in rows and rows[k].error is not None)
    return BuildOutcome(keys=len(mine), ran=len(todo), failed=failed)


class SettingsChanged(ValueError):
    """A resumed step whose settings differ from those its rows were made with."""


def check_settings(root: Path, settings: dict[str, Any], made: str) -> None:
    """A resumed step keeps what its rows were made from (settings, input digest, models):
    SettingsChanged naming what changed. The first run records them as `plan.json`."""
    path = root / "plan.json"
    if not path.is_file():
        root.mkdir(parents=True, exist_ok=True)
        write_whole(path, json.dumps(settings, indent=1, ensure_ascii=False))
        return
    try:
        before = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(before, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError, RecursionError) as e:
        raise SettingsChanged(
            f"{path}: unreadable ({type(e).__name__}: {e}): what {root}'s rows were made with is "
            "not known; restore it, or build into another --out"
        ) from e
    changed = [k for k in {**before, **settings} if before.get(k) != settings.get(k)]
    if changed:
        raise SettingsChanged(
            f"{root}: {made} before with other {', '.join(changed)} "
            f"({json.dumps({k: before.get(k) for k in changed}, ensure_ascii=False)}); "
            "give the same settings and input, or another --out"
        )


def digest(rows: Sequence[Any]) -> str:
    """sha256 of JSON data: what a step's rows were made from."""
    text = json.dumps(list(rows), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()
