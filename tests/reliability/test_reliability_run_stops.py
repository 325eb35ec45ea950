"""How a run stops, through the real key loop (`run_keys`) and `until_signalled`: a dead
server is raised, not reported as a signal; the closing account holds every record written,
after one signal or two; a run under another shard count than a live one is refused. Each
stop is set at a point of the run's progress (a write held in its thread, a key started),
never after a delay."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Instance, Record
from cts.eval.experiment import until_signalled
from cts.eval.run.locks import ShardBusy
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import Shard
from cts.eval.run.runner import RunOutcome, run_keys
from cts.serving.vllm_server import ServerError

ROOT = Path(__file__).resolve().parents[2]


def instances(n: int) -> list[Instance]:
    return load_instances(DatasetSource(path="sample", split="dev", limit=n))


async def blank_record(instance: Instance, condition: str, seed: int) -> Record:
    return Record(instance_id=instance.id, condition=condition, seed=seed)


class HeldWrites:
    """Every record's write waits in the writer thread until `release` is set; `submitted`
    is set once `expected` records have been handed to the writer."""

    def __init__(self, store: RecordStore, expected: int, monkeypatch: pytest.MonkeyPatch):
        import cts.eval.run.runner

        self.release = threading.Event()
        self.submitted = asyncio.Event()
        real_append = store.append

        def held_append(record: Record, shard: Shard) -> None:
            assert self.release.wait(60)  # a hang guard
            real_append(record, shard)

        store.append = held_append  # type: ignore[method-assign]
        handed: list[int] = []
        submitted = self.submitted

        class Counting(cts.eval.run.runner.ThreadPoolExecutor):
            def submit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
                handed.append(1)
                if len(handed) == expected:
                    submitted.set()
                return super().submit(*args, **kwargs)

        monkeypatch.setattr(cts.eval.run.runner, "ThreadPoolExecutor", Counting)


def blurred(
    data: list[Instance], store: RecordStore, shard: Shard | None = None, **options: Any
) -> Coroutine[Any, Any, RunOutcome]:
    """run_keys over `data`'s blurred keys, seed 0, each a blank record."""
    return run_keys(data, ["blurred"], [0], blank_record, store, shard or Shard(), **options)


def test_a_dead_server_stops_the_real_key_loop_and_is_raised(tmp_path):
    """run_keys answers the watch's cancellation with an interrupted outcome (as it answers a
    signal): the server's death must still be what the run ends with (exit 1, `server error`),
    not `interrupted` (exit 130)."""
    dead: list[str] = []

    async def hangs(instance: Instance, condition: str, seed: int) -> Record:
        dead.append(instance.id)  # its server died as the key started: its request hangs
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    def watch() -> None:
        if dead:
            raise ServerError("model judge: vLLM server exited with code -9")

    work = run_keys(instances(2), ["blurred"], [0], hangs, RecordStore(tmp_path))
    with pytest.raises(ServerError, match="model judge"):
        asyncio.run(until_signalled(work, watch, poll_s=0.001))
    assert dead


def test_a_stopped_run_counts_every_record_its_writer_finished(tmp_path, monkeypatch):
    """A signal while three records wait for the writer thread: the keys awaiting them are
    cancelled, but the writes finish; the account and the progress count all three."""
    store = RecordStore(tmp_path)
    held = HeldWrites(store, 3, monkeypatch)
    progressed: list[Record] = []

    async def stopped_while_writing() -> RunOutcome:
        work = asyncio.ensure_future(
            blurred(instances(3), store, concurrency=3, on_done=progressed.append)
        )
        await held.submitted.wait()
        work.cancel()  # what the SIGTERM handler does; the keys awaiting writes are cancelled
        held.release.set()
        return await work

    outcome = asyncio.run(stopped_while_writing())
    assert outcome.interrupted
    assert len(store.completed()) == 3
    assert outcome.ran == 3 and len(progressed) == 3


def test_a_second_signal_keeps_the_counts_of_the_records_written(tmp_path, monkeypatch):
    """Ctrl-C twice: the second cancels the run's wait for its writes, so run_keys never
    returns its outcome; `until_signalled` returns the one it was given, counts kept."""
    import cts.eval.run.runner

    store = RecordStore(tmp_path)
    held = HeldWrites(store, 1, monkeypatch)
    waiting_for_writes = asyncio.Event()

    class Waiting(set):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            waiting_for_writes.set()  # only the stopped run iterates it, to wait for them
            return super().__iter__()

    class Writes(cts.eval.run.runner._Writes):
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            self.waiting = Waiting()

    monkeypatch.setattr(cts.eval.run.runner, "_Writes", Writes)
    progressed: list[Record] = []
    outcome = RunOutcome()

    async def stopped_twice() -> RunOutcome:
        work = asyncio.ensure_future(
            blurred(instances(1), store, on_done=progressed.append, outcome=outcome)
        )
        stopping = asyncio.ensure_future(until_signalled(work, outcome=outcome))
        await held.submitted.wait()
        work.cancel()  # the first signal
        await waiting_for_writes.wait()
        work.cancel()  # the second, while the run waits for the record being written
        held.release.set()
        return await stopping

    returned = asyncio.run(stopped_twice())
    assert returned is outcome and outcome.interrupted
    assert len(store.completed()) == 1
    assert outcome.ran == 1 and len(progressed) == 1


HOLDER = (
    "import sys; from pathlib import Path\n"
    "from cts.eval.run.run_dir import Shard; from cts.eval.run.runner import shard_count_lock\n"
    "with shard_count_lock(Path(sys.argv[1]), Shard(0, 2)):\n"
    "    print('held', flush=True); sys.stdin.read()"  # held until killed
)


def test_a_run_under_another_shard_count_than_a_live_one_is_refused(tmp_path):
    """Shard 0/2 live: the run unsharded (or as 3 shards) would take the keys it has yet to
    write and record them twice, which `merge` refuses for good; shard 1/2 runs beside it. A
    killed holder frees its count."""
    store = RecordStore(tmp_path / "run")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(store.root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    data = instances(2)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for other in (Shard(), Shard(1, 3)):
            with pytest.raises(ShardBusy, match=r"\.of-2\.lock: .* as 2 shard\(s\); running it"):
                asyncio.run(blurred(data, store, other))
        beside = asyncio.run(blurred(data, store, Shard(1, 2)))
        assert beside.ran == 1  # the same count: its own instance, side by side
    finally:
        holder.kill()
        holder.wait()
    again = asyncio.run(blurred(data, store, Shard()))
    assert again.ran == 1 and again.skipped == 1  # the holder's lock died with it
    assert len(store.completed()) == 2
