"""Issue 13: readers of a run never write to it, resume skips keys done under any sharding,
duplicate seeds/conditions and unsafe output_dir templates are config errors."""

from __future__ import annotations

import asyncio
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Instance, Record
from cts.eval.experiment import merge_run
from cts.eval.report.report import load_run
from cts.eval.run.config import load_experiment
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import RunDir, Shard
from cts.eval.run.runner import run_keys
from cts.foundation.yaml_config import ConfigError, Override
from cts.train.config import load_train_config


def instances(n: int) -> list[Instance]:
    return load_instances(DatasetSource(path="sample", split="dev", limit=n))


Key = tuple[str, str, int]


def scripted(failing: frozenset[Key] | set[Key] = frozenset()):  # type: ignore[no-untyped-def]
    """A work function that records each key it runs (a failure for the keys in `failing`)."""
    ran: list[Key] = []

    async def run_one(instance: Instance, condition: str, seed: int) -> Record:
        key = (instance.id, condition, seed)
        ran.append(key)
        error = {"kind": "x", "stage": "search", "message": "down"} if key in failing else None
        return Record(instance_id=instance.id, condition=condition, seed=seed, error=error)

    return run_one, ran


def run(  # type: ignore[no-untyped-def]
    data, store, shard: Shard | None = None, retry_failed=False, failing=frozenset()
):
    run_one, ran = scripted(failing)
    outcome = asyncio.run(
        run_keys(
            data, ["blurred"], [0], run_one, store, shard or Shard(), retry_failed=retry_failed
        )
    )
    return outcome, ran


def tear(path: Path) -> bytes:
    """Append half a record line, as a writer killed mid-write leaves it; the file's bytes."""
    half = Record(instance_id="torn", condition="blurred", seed=0).model_dump_json()
    with path.open("ab") as f:
        f.write(half[: len(half) // 2].encode())
    return path.read_bytes()


def run_dir_with_torn_shard(tmp_path: Path) -> tuple[Path, Path, bytes]:
    """A run directory (config + records of 2 of 3 instances), its shard ending mid-line."""
    resolved = load_experiment(
        "quickstart", [Override(("conditions",), ["blurred"]), Override(("dataset", "limit"), 3)]
    )
    RunDir(tmp_path).write_config(resolved)
    store = RecordStore(tmp_path)
    run(instances(2), store)
    path = store.path("blurred", Shard())
    return tmp_path, path, tear(path)


def test_readers_leave_a_torn_last_line_byte_identical(tmp_path):
    run_dir, path, before = run_dir_with_torn_shard(tmp_path)
    assert len(RecordStore(run_dir).completed()) == 2  # the torn line is skipped in memory
    assert path.read_bytes() == before
    report = merge_run(run_dir)
    assert not report.ok and len(report.missing) == 1
    assert path.read_bytes() == before
    load_run(run_dir)
    assert path.read_bytes() == before


def test_a_resumed_writer_repairs_only_its_own_torn_shard_and_appends(tmp_path):
    store = RecordStore(tmp_path)
    data = instances(4)
    run(data, store, Shard(0, 2))
    run(data, store, Shard(1, 2))
    mine, other = store.path("blurred", Shard(0, 2)), store.path("blurred", Shard(1, 2))
    clean = mine.read_bytes()
    tear(mine)
    other_before = tear(other)
    outcome, ran = run(instances(6), store, Shard(0, 2))
    assert ran == [(instances(6)[4].id, "blurred", 0)]  # the one key of shard 0 not done
    assert outcome.ran == 1 and outcome.skipped == 2
    # The torn half line is gone and the new record starts on a line of its own.
    assert mine.read_bytes().startswith(clean)
    assert len(store.read(mine)) == 3 and mine.read_bytes().endswith(b"\n")
    assert other.read_bytes() == other_before  # another shard's writer repairs its own file


def test_reading_a_read_only_run_directory_raises_no_permission_error(tmp_path):
    run_dir, path, before = run_dir_with_torn_shard(tmp_path)
    modes = {p: p.stat().st_mode for p in [run_dir, *run_dir.rglob("*")]}
    for p in modes:
        p.chmod(stat.S_IMODE(modes[p]) & ~0o222)
    try:
        if os.access(path, os.W_OK):
            pytest.skip("running as a user who can write read-only files (root)")
        assert len(RecordStore(run_dir).completed()) == 2
        assert len(load_run(run_dir).records) == 2
        assert not merge_run(run_dir).ok
        assert path.read_bytes() == before
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def test_resume_under_another_shard_count_skips_keys_done_in_any_shard(tmp_path):
    store = RecordStore(tmp_path)
    data = instances(4)
    failed = {(data[1].id, "blurred", 0)}
    first, _ = run(data, store, Shard(0, 1), failing=failed)
    assert first.ran == 4
    for index in range(2):
        outcome, ran = run(data, store, Shard(index, 2))
        assert (outcome.ran, outcome.skipped, ran) == (0, 2, [])
    # --retry-failed semantics are unchanged: a failure is done unless retried, wherever it is.
    again, ran = run(data, store, Shard(1, 2), retry_failed=True)
    assert ran == [(data[1].id, "blurred", 0)] and (again.ran, again.skipped) == (1, 1)
    assert all(r.error is None for r in store.completed().values())
    assert run(data, store, Shard(0, 3), retry_failed=True)[1] == []


def test_duplicate_seeds_or_conditions_are_a_config_error_naming_the_key():
    for key, value in (("seeds", "[0, 0]"), ("conditions", "[blurred, blurred]")):
        with pytest.raises(ConfigError, match=rf"--set {key}: .*duplicate"):
            load_experiment("quickstart", [f"{key}={value}"])
    # Distinct values still load.
    assert load_experiment("quickstart", ["seeds=[0, 1]"]).experiment.seeds == [0, 1]


BAD_TEMPLATES = [
    "runs/{name.__class__.__mro__}",
    "runs/{name[0]}",
    "runs/{nope}",
    "runs/{0}",
    "runs/{}",
    "runs/x{name",
    "runs/x}name",
    "runs/{name!r}",
    "runs/{name:>20}",
    "runs/{name:{name}}",
]


def test_output_dir_templates_allow_only_the_documented_fields(tmp_path):
    for template in BAD_TEMPLATES:
        with pytest.raises(
            ConfigError, match=r"output_dir: .*(not a template field|literal brace)"
        ):
            load_experiment("quickstart", [Override(("output_dir",), template)])
        with pytest.raises(ConfigError, match=r"output_dir: "):
            load_train_config("quickstart", [Override(("output_dir",), template)])
    # {clarifier} belongs to experiments only.
    with pytest.raises(ConfigError, match=r"output_dir: .*clarifier"):
        load_train_config("quickstart", [Override(("output_dir",), "runs/{clarifier}")])
    # In a file, the error names file:line: output_dir.
    config = tmp_path / "t.yaml"
    config.write_text("name: t\noutput_dir: 'runs/{name.__dict__}'\n")
    with pytest.raises(ConfigError, match=rf"{config}:2: output_dir: "):
        load_train_config(config)
    # The documented forms, and escaped braces, still work.
    resolved = load_experiment(
        "quickstart", [Override(("output_dir",), "runs/{{x}}/{name}-{clarifier}")]
    )
    assert resolved.output_dir() == Path(
        f"runs/{{x}}/{resolved.experiment.name}-{resolved.clarifier_label()}"
    )
    train = load_train_config("quickstart", [Override(("output_dir",), "out/{name}")])
    assert train.resolved_output_dir() == Path(f"out/{train.name}")


def test_a_shard_another_live_process_runs_is_refused_and_free_once_it_ends(tmp_path):
    """Two writers of one shard would repair each other's lines and write keys twice: the
    second is refused naming the holder's pid; a killed holder leaves no stale lock."""
    import subprocess
    import sys

    from cts.eval.run.locks import ShardBusy, shard_lock

    store = RecordStore(tmp_path / "run")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path\n"
            "from cts.eval.run.run_dir import Shard; from cts.eval.run.runner import shard_lock\n"
            "with shard_lock(Path(sys.argv[1]), Shard(0, 2)):\n"
            "    print('held', flush=True); sys.stdin.read()",  # held until killed
            str(store.root),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ShardBusy, match=f"shard 0/2 .* \\(pid {holder.pid}\\)"):
            asyncio.run(run_keys([], ["oracle"], [0], None, store, Shard(0, 2)))  # type: ignore[arg-type]
        with shard_lock(store.root, Shard(1, 2)):  # another shard of the run is free
            pass
    finally:
        holder.kill()
        holder.wait()
    outcome = asyncio.run(run_keys([], ["oracle"], [0], None, store, Shard(0, 2)))  # type: ignore[arg-type]
    assert outcome.ran == 0


def held_writes(store: RecordStore) -> tuple[threading.Event, threading.Event]:
    """Each record `store` appends waits in its writer thread until `release` is set;
    `writing` is set once one is being written."""
    writing, release = threading.Event(), threading.Event()
    real_append = store.append

    def slow_append(record: Record, shard: Shard) -> None:
        writing.set()
        assert release.wait(60)  # a hang guard
        real_append(record, shard)

    store.append = slow_append  # type: ignore[method-assign]
    return writing, release


async def blank_record(instance: Instance, condition: str, seed: int) -> Record:
    return Record(instance_id=instance.id, condition=condition, seed=seed)


def test_a_stopped_run_lets_the_record_being_written_finish_before_it_returns(tmp_path):
    """Records are written in a worker thread: a run cancelled (a signal) while one is being
    written returns, and lets go of its shard's lock, only once that record is whole on disk,
    so that a resumed run cannot cut a line still being written."""
    store = RecordStore(tmp_path)
    writing, release = held_writes(store)

    async def stopped_while_writing() -> None:
        work = asyncio.ensure_future(run_keys(instances(1), ["blurred"], [0], blank_record, store))
        while not writing.is_set():
            await asyncio.sleep(0.01)
        work.cancel()  # what the SIGTERM handler does
        await asyncio.sleep(0.05)
        assert not work.done()  # still waiting for the write
        release.set()
        outcome = await work
        # Whole on disk, so counted by this run's account and found done by a resumed run.
        assert outcome.interrupted and outcome.ran == 1
        assert [r.key for r in store.completed().values()] == [(instances(1)[0].id, "blurred", 0)]

    asyncio.run(stopped_while_writing())


def test_a_second_signal_while_a_record_is_written_keeps_the_shard_locked_until_it_is_whole(
    tmp_path, monkeypatch
):
    """A second SIGTERM cancels the run's wait for its writes too: the shard's lock must still
    be held until the record being written is whole (else a resumed run could cut it). The
    lock is probed once the run has gone as far as it can without the write (it waits for
    the record writer to end, or it has returned), not after a delay."""
    import cts.eval.run.runner
    from cts.eval.run.locks import ShardBusy, shard_lock

    store = RecordStore(tmp_path)
    writing, release = held_writes(store)
    stopping = threading.Event()  # the run waits for its writer, or has returned
    lock_while_writing: list[str] = []

    class Writer(ThreadPoolExecutor):
        def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
            if wait:  # it waits below for the held record
                stopping.set()
            super().shutdown(wait, cancel_futures=cancel_futures)

    monkeypatch.setattr(cts.eval.run.runner, "ThreadPoolExecutor", Writer)

    def probe() -> None:  # in a thread: the event loop may be blocked waiting for the writer
        assert stopping.wait(60)
        try:
            with shard_lock(store.root, Shard()):
                lock_while_writing.append("free")
        except ShardBusy:
            lock_while_writing.append("held")
        release.set()

    async def stopped_twice_while_writing() -> None:
        work = asyncio.ensure_future(run_keys(instances(1), ["blurred"], [0], blank_record, store))
        while not writing.is_set():
            await asyncio.sleep(0.01)
        work.cancel()
        await asyncio.sleep(0.05)
        work.cancel()  # the second signal
        try:
            with pytest.raises(asyncio.CancelledError):
                await work
        finally:
            stopping.set()

    prober = threading.Thread(target=probe)
    prober.start()
    asyncio.run(stopped_twice_while_writing())
    prober.join()
    assert lock_while_writing == ["held"]
    assert [r.key for r in store.completed().values()] == [(instances(1)[0].id, "blurred", 0)]
