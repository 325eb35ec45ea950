"""Runs (instance, condition, seed) keys concurrently into a run directory that survives crashes.

Each finished record is one JSONL line appended with flush + fsync to
records/<condition>/shard-<i>-of-<n>.jsonl, so a kill loses at most the line being written; a
torn last line is skipped by readers and cut off only by that shard's next writer, and resume
(the default) skips every key already recorded in any shard file. `--shard i/n` takes the
instances whose position in the dataset is i modulo n; `merge` checks that every key is present
exactly once across shards.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import math
import os
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from cts.eval.data.schema import Instance, Record
from cts.eval.run.bulk import collector_paused
from cts.eval.run.config import KeyOrder
from cts.eval.run.progress import ShowProgress
from cts.eval.run.run_dir import RunDir, Shard
from cts.eval.run.schedule import KeyCosts, group_of
from cts.eval.run.slots import KeySlots
from cts.serving.disk import append_line, storage_errors, write_whole
from cts.serving.outputs import valid_unicode
from cts.serving.replicas import conversation
from cts.serving.secrets import redact

Key = tuple[str, str, int]


class RecordFileError(ValueError):
    """A complete line of a records file is not a record (file:line: why)."""


class ShardBusy(RuntimeError):
    """Another live process is running this shard of this run directory."""


@contextmanager
def shard_lock(root: Path, shard: Shard) -> Iterator[None]:
    """Hold the shard's lock while running it. Two writers of one shard (a requeued Slurm task
    that starts while the old one still runs, a command typed twice) would each repair the
    other's torn lines and write each key twice. The lock is the kernel's (flock): a killed
    holder releases it, so a crash never leaves a stale lock behind."""
    path = root / f".{shard.name}.lock"
    with storage_errors(path):
        root.mkdir(parents=True, exist_ok=True)
        handle = path.open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise ShardBusy(
                f"{path}: shard {shard.index}/{shard.count} of this run is being run by another "
                f"process (pid {holder}); two writers would mix their records: wait for it to "
                "end, or stop it, then run the same command again"
            ) from None
        with suppress(OSError):  # the pid only names the holder; a full disk must not stop here
            handle.truncate(0)
            handle.write(str(os.getpid()))
            handle.flush()
        yield
    finally:
        handle.close()  # releases the lock


def _count_of(path: Path) -> int | None:
    """N of a shard count's lock file `.of-N.lock` (None: another file)."""
    count = path.name.removeprefix(".of-").removesuffix(".lock")
    return int(count) if count.isdigit() else None


def _live_other_count(root: Path, count: int) -> int | None:
    """Another shard count whose lock some live process holds, if any. A held lock is known
    only by failing to take it: a free one is taken and let go at once."""
    for path in sorted(root.glob(".of-*.lock")):
        other = _count_of(path)
        if other is None or other == count:
            continue
        with storage_errors(path), path.open("rb") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return other
    return None


@contextmanager
def shard_count_lock(root: Path, shard: Shard) -> Iterator[None]:
    """Hold the lock of the shard's count (`.of-N.lock`) while running it. Shards of one count
    split the instances alike, so they run side by side (the lock is shared); a writer of
    another count would take keys a live shard has yet to write and record them twice, which
    `merge` then refuses for good: it is ShardBusy, naming the other count. Each writer takes
    its own count's lock before looking for another's, so of two starting at once at least
    one is refused. The kernel's lock (flock): a killed holder leaves none behind."""
    path = root / f".of-{shard.count}.lock"
    with storage_errors(path):
        root.mkdir(parents=True, exist_ok=True)
        handle = path.open("a+")
    try:
        # Waits only while another count's writer looks at this lock (an instant).
        fcntl.flock(handle, fcntl.LOCK_SH)
        other = _live_other_count(root, shard.count)
        if other is not None:
            raise ShardBusy(
                f"{root / f'.of-{other}.lock'}: another live process runs this run as {other} "
                f"shard(s); running it as {shard.count} shard(s) beside it would write keys "
                "twice (each count splits the instances its own way): wait for those shards to "
                "end, or stop them, then run again"
            )
        yield
    finally:
        handle.close()  # releases the lock


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


class RunControl(TypedDict, total=False):
    """How a run goes over its keys, each part optional: the keywords `run_experiment`,
    `build_golden` and `rejudge_run` take."""

    #: Only this shard's instances (default: all of them).
    shard: Shard | None
    #: A progress bar (True), a line every N seconds where there is no terminal, or nothing.
    show_progress: ShowProgress
    #: Polled during the run: what it raises (a dead model server) stops the run, keeping
    #: every finished record.
    watch: Callable[[], None] | None
    #: Keys whose record is a failure run again (the new record counts).
    retry_failed: bool


def already_done(
    store: RecordStore,
    shard: Shard,
    keys: tuple[set[str], list[str], list[int]],
    retry_failed: bool,
) -> int:
    """Of `keys` (instance ids, conditions, seeds), those recorded in any shard file of the run
    that can hold the shard's keys, as `run_keys` counts them (the shard count may have changed
    since); with `retry_failed` a failure is not done."""
    ids, conditions, seeds = keys
    return sum(
        not (retry_failed and r.error)
        for key, r in store.completed_for(shard).items()
        if key[0] in ids and key[1] in conditions and key[2] in seeds
    )


def counts_over(earlier: Record | None, record: Record) -> Record:
    """Of two records of one key, the one that counts: a success over a failure (the failure
    was retried with --retry-failed, or the success is the retry), else the later one."""
    if earlier is None or earlier.error is not None:
        return record
    return earlier if record.error is not None else record


@dataclass
class RunOutcome:
    ran: int = 0
    skipped: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    interrupted: bool = False


RunOne = Callable[[Instance, str, int], Awaitable[Record]]


#: What a record that cannot be written keeps: its key, its breakdowns and what it cost (the
#: text that could not be written is what is left behind).
_KEPT_ON_FAILURE = set(
    "instance_id condition seed language removed_constraints usage seconds".split()
)


def writable(record: Record) -> Record:
    """`record`, or, when it cannot be serialized (text no encoding holds, such as a lone
    surrogate that reached it unsanitised), its key's `internal` failure: one bad key must not
    stop the run here, outside the stages' failure boundary, nor every resume after it."""
    try:
        record.model_dump_json()
    except (PydanticSerializationError, ValueError) as e:
        message = valid_unicode(redact(f"{type(e).__name__}: {e}"))[:500]
        return Record(
            **record.model_dump(include=_KEPT_ON_FAILURE),
            error={"kind": "internal", "stage": "record", "message": message},
        )
    return record


class ProgressHold:
    """A test hook: `$CTS_HOLD_AT_RECORDS=N:DIR` lets a run start N keys only; once their N
    records are written (nothing else under way) it touches DIR/held and starts no other key
    until DIR/release exists. Tests stop, kill or inspect a run at a point of its progress
    rather than after a delay, which a faster machine would outrun."""

    def __init__(self, at_records: int | None = None, directory: Path | None = None) -> None:
        self.at_records, self.directory = at_records, directory
        self.started = 0
        self._released = asyncio.Event()

    @classmethod
    def from_env(cls) -> ProgressHold:
        value = os.environ.get("CTS_HOLD_AT_RECORDS")
        if not value:
            return cls()
        count, directory = value.split(":", 1)
        return cls(int(count), Path(directory))

    async def passed(self) -> None:
        """Called as a key starts: past the first N, wait for the release."""
        self.started += 1
        if self.at_records is not None and self.started > self.at_records:
            await self._released.wait()

    async def after_record(self, written: int) -> None:
        if written != self.at_records or self.directory is None:
            return
        (self.directory / "held").touch()
        while not (self.directory / "release").exists():
            await asyncio.sleep(0.05)
        self._released.set()


class _Writes:
    """Records handed to the writer thread, each counted (ran, failures, `on_done`) once it is
    on disk and only then, by its key or, for a key cancelled while it waited, when the run
    stops: its write (and those queued behind it) still finish, and the account must hold
    every record the run wrote."""

    def __init__(
        self,
        store: RecordStore,
        shard: Shard,
        outcome: RunOutcome,
        on_done: Callable[[Record], None] | None,
    ) -> None:
        self.store, self.shard, self.outcome, self.on_done = store, shard, outcome, on_done
        # One thread: a shard file's lines go in the order the records were handed over.
        self.thread = ThreadPoolExecutor(1, "cts-records")
        self.pending: dict[Future[None], Record] = {}
        self.waiting: set[asyncio.Future[None]] = set()

    def submit(self, record: Record) -> tuple[Future[None], asyncio.Future[None]]:
        """Start writing `record`: its write, and a future to await it with."""
        done = self.thread.submit(self.store.append, record, self.shard)
        self.pending[done] = record
        written = asyncio.wrap_future(done)
        self.waiting.add(written)
        written.add_done_callback(self.waiting.discard)
        return done, written

    def count(self, done: Future[None]) -> None:
        """Count the record of a finished write once (a failed or dropped write is no record)."""
        if not done.done() or done not in self.pending:
            return
        record = self.pending.pop(done)
        if done.cancelled() or done.exception() is not None:
            return
        self.outcome.ran += 1
        if record.error:
            self.outcome.failures[record.error["kind"]] += 1
        if self.on_done:
            self.on_done(record)

    def close(self) -> None:
        """Wait for every write under way (shutdown(wait=True), which no second signal can
        cancel), then count those no key counted."""
        self.thread.shutdown(wait=True)
        for done in list(self.pending):
            self.count(done)


async def run_keys(
    instances: list[Instance],
    conditions: Iterable[str],
    seeds: Iterable[int],
    run_one: RunOne,
    store: RecordStore,
    shard: Shard = Shard(),
    concurrency: int = 4,
    on_done: Callable[[Record], None] | None = None,
    retry_failed: bool = False,
    key_order: KeyOrder = "longest_first",
    outcome: RunOutcome | None = None,
) -> RunOutcome:
    """Run every key of this shard not recorded yet (and, with `retry_failed`, every key whose
    record is a failure); return counts. Cancelling (Ctrl-C, SIGTERM) stops in-flight keys;
    finished ones are already on disk. A key recorded in any shard file that can hold it counts
    as done, so a run resumed with another shard count re-runs nothing. Another live process
    running the same shard, or the run under another shard count, is refused (ShardBusy).
    `outcome` (a new one if None) is filled as the run goes: a caller that keeps it has the
    counts even when a second signal cancels this before it returns (`until_signalled`)."""
    outcome = outcome if outcome is not None else RunOutcome()
    # Records are written by a thread of their own, and leaving this block waits for it before
    # the shard's lock is let go: a resumed run may cut a torn last line, which must never be a
    # line still being written.
    with shard_lock(store.root, shard), shard_count_lock(store.root, shard):
        writes = _Writes(store, shard, outcome, on_done)
        try:
            await _run_keys(
                instances,
                conditions,
                seeds,
                run_one,
                concurrency,
                retry_failed,
                key_order,
                writes,
            )
        finally:
            writes.close()
    return outcome


async def _run_keys(
    instances: list[Instance],
    conditions: Iterable[str],
    seeds: Iterable[int],
    run_one: RunOne,
    concurrency: int,
    retry_failed: bool,
    key_order: KeyOrder,
    writes: _Writes,
) -> None:
    store, shard, outcome = writes.store, writes.shard, writes.outcome
    conditions, seeds = list(conditions), list(seeds)
    # This process is the only writer of its shard's files: it alone repairs a torn tail
    # left by its crashed predecessor, before appending after it.
    for condition in conditions:
        store.repair(store.path(condition, shard))
    done = {
        key: r
        for key, r in store.completed_for(shard).items()
        if not (retry_failed and r.error is not None)
    }
    keys = [(inst, c, s) for inst in shard.select(instances) for c in conditions for s in seeds]
    todo = [(inst, c, s) for inst, c, s in keys if (inst.id, c, s) not in done]
    outcome.skipped = len(keys) - len(todo)
    costs = KeyCosts(done.values())
    ranked = key_order == "longest_first"
    if ranked:  # the first slots go in this order, later ones by `costs` as keys finish
        todo.sort(key=lambda key: -costs.expected(group_of(key[1])))
    slots = KeySlots(concurrency, costs.expected if ranked else None)
    hold = ProgressHold.from_env()

    async def one(instance: Instance, condition: str, seed: int) -> None:
        # Held before its slot: a held key keeps no slot from a started one that gave its
        # slot back for a wait (a clarify@k key on its dialogue) and needs one again.
        await hold.passed()
        # One conversation a key: a model served by replicas keeps all of its requests on one
        # (cts/serving/replicas.py), where its earlier turns are in the prefix cache.
        async with slots.held(group_of(condition) if ranked else ""):
            with conversation(f"{instance.id}/{condition}/{seed}"):
                record = writable(await run_one(instance, condition, seed))
        costs.observe(record)
        # Written and fsync'd in a worker thread, so that the other keys' requests go on
        # meanwhile (an fsync waits on the disk). The key counts as done once the thread is
        # back: a record is on disk before it counts. Shielded: a cancelled key leaves its
        # write to finish (the run waits for it below, and counts it then).
        write, written = writes.submit(record)
        await asyncio.shield(written)
        writes.count(write)
        await hold.after_record(outcome.ran)

    tasks = [asyncio.create_task(one(*key)) for key in todo]
    try:
        await asyncio.gather(*tasks)
    except BaseException as e:
        # Cancelled (a signal), or an error that stops the whole run (a dead server, a full
        # disk): the keys in flight stop unrecorded and run again on resume (those whose record
        # was being written are recorded, and count).
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Every write under way ends before this returns (and run_keys lets go of the lock).
        await asyncio.gather(*writes.waiting, return_exceptions=True)
        if not isinstance(e, asyncio.CancelledError):
            raise
        outcome.interrupted = True


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
