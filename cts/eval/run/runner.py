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
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from pydantic_core import PydanticSerializationError

from cts.eval.data.schema import Instance, Record
from cts.eval.run.config_sections import KeyOrder
from cts.eval.run.locks import shard_count_lock, shard_lock
from cts.eval.run.progress import ShowProgress
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import Shard
from cts.eval.run.schedule import KeyCosts, group_of
from cts.eval.run.slots import KeySlots
from cts.foundation.secrets import redact
from cts.serving.outputs import valid_unicode
from cts.serving.replicas import conversation


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
