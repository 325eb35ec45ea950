"""A full disk: a run directory (and the caches) on a small tmpfs that fills up mid-run.

The first write that fails stops `cts run` with one message naming the file and "No space left
on device" (exit 1, no traceback); nothing half-written is left looking complete; once space is
freed the same command resumes to the records of an uninterrupted run. The writers are also
driven into a full disk one by one, where a write really is cut short.
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from cts.eval.data.schema import Record
from cts.eval.run.config import load_experiment
from cts.eval.run.config_sections import ALL_CONDITIONS
from cts.eval.run.dialogue import Dialogue, DialogueStore
from cts.eval.run.pipeline import run_instance
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import RunDir, Shard
from cts.eval.run.runner import run_keys
from cts.foundation.disk import StorageFull, append_line, write_whole
from cts.serving.cache import ResponseCache
from cts.serving.types import ChatResponse
from cts.webdancer.tool_cache import ToolCache
from tests.fault_helpers import cts_run_args
from tests.scripted import dev_instances as instances
from tests.scripted import scripted_context as context
from tests.scripted_cts import ROOT, cts

LIMIT = 10
TOTAL = LIMIT * len(ALL_CONDITIONS)
REPORT_FILES = ("summary.json", "report.md", "report.html", "figures")


# -- a small tmpfs --------------------------------------------------------------------------


def ran_in_a_namespace(request: pytest.FixtureRequest, tmp_path: Path) -> bool:
    """Mounting needs root. Not root: run this very test again inside `unshare -rm` (a user
    and mount namespace, where it is root) and return True once it passed there; skip when
    neither is possible."""
    if os.geteuid() == 0:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: not root, and `unshare -rm` fails: {probe.stderr}")
    pytest_args = ["-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "inner")]
    inner = subprocess.run(
        ["unshare", "-rm", sys.executable, "-m", "pytest", *pytest_args, request.node.nodeid],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert inner.returncode == 0, inner.stdout[-4000:] + inner.stderr[-2000:]
    return True


@dataclass
class Disk:
    root: Path

    @property
    def page(self) -> int:
        return os.statvfs(self.root).f_frsize

    def free(self) -> int:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int = 0) -> None:
        """A filler file taking all the free space but `leave` bytes (whole pages)."""
        leave -= leave % self.page
        fd = os.open(self.root / "filler", os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            os.posix_fallocate(fd, 0, self.free() - leave)
        finally:
            os.close(fd)
        assert self.free() == leave

    def make_room(self) -> None:
        (self.root / "filler").unlink()


@contextmanager
def tmpfs(root: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted on the new folder `root` for the block (the caller may mount)."""
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(root)], check=True)
    try:
        yield root
    finally:
        # Lazily when a failed test left a file open there.
        if subprocess.run(["umount", str(root)]).returncode:
            subprocess.run(["umount", "-l", str(root)], check=True)


@pytest.fixture
def mounted(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Disk | None]:
    """A 4 MiB tmpfs; None once this very test has run, and passed, in a namespace
    (`ran_in_a_namespace`), and has nothing left to do here."""
    if ran_in_a_namespace(request, tmp_path):
        yield None
        return
    with tmpfs(tmp_path / "disk", "size=4m") as root:
        yield Disk(root)


def pages(paths: list[Path], page: int) -> int:
    """What files take on a tmpfs: whole pages."""
    return sum(math.ceil(p.stat().st_size / page) * page for p in paths if p.is_file())


# -- checks -----------------------------------------------------------------------------------


def comparable(run_dir: Path) -> dict[tuple[str, str, int], dict]:
    """Every key's record but its timing and cache usage (a resumed key may hit the cache)."""
    done = RecordStore(run_dir).completed()
    return {k: r.model_dump(exclude={"seconds", "usage"}) for k, r in done.items()}


def check_nothing_torn(disk: Path, run_dir: Path) -> dict[Path, bytes]:
    """No temporary left, every JSONL line whole and valid, every trace whole JSON, every
    SQLite file consistent with valid rows; the bytes of each file, to compare after resume."""
    assert not [p for p in disk.rglob("*") if ".partial" in p.name]
    for path in [*run_dir.glob("records/*/*.jsonl"), *run_dir.glob("dialogues/*.jsonl")]:
        data = path.read_bytes()
        assert not data or data.endswith(b"\n"), f"{path}: a torn last line"
        for line in data.splitlines():
            model = Record if "records" in path.parts else Dialogue
            model.model_validate_json(line)
    for path in run_dir.glob("traces/*/*.json"):
        json.loads(path.read_text())
    for path in disk.rglob("*.sqlite"):
        check_sqlite(path)
    return {
        p: p.read_bytes()
        for p in run_dir.rglob("*")
        # A shard's lock file holds its last holder's pid, not data.
        if p.is_file() and "traces" not in p.relative_to(run_dir).parts and p.suffix != ".lock"
    }


def check_sqlite(path: Path) -> None:
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)], path
        # A cache the full disk kept from being set up may have no table yet.
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
        if "responses" in tables:
            for (blob,) in db.execute("SELECT response FROM responses"):
                ChatResponse.model_validate_json(blob)
        if "tool_calls" in tables:
            for (blob,) in db.execute("SELECT result FROM tool_calls"):
                json.loads(blob)
    finally:
        db.close()


def check_kept(before: dict[Path, bytes]) -> None:
    """What a stopped run left is what the resumed run kept: a JSONL file it appended to
    starts with it, any other file (config, summary, report) is the same, so it was whole."""
    for path, data in before.items():
        after = path.read_bytes()
        if path.suffix == ".jsonl":
            assert after.startswith(data), path
        else:
            assert after == data, path


# -- a run on a disk that fills up --------------------------------------------------------------


def run_args(run_dir: Path, cache_dir: Path) -> list[str]:
    caches = f"cache.path={cache_dir / 'responses.sqlite'}"
    tools = f"search.tool_cache={cache_dir / 'tools.sqlite'}"
    return cts_run_args(run_dir, LIMIT, caches, tools)


@dataclass
class Reference:
    home: Path
    run_dir: Path
    records: dict[tuple[str, str, int], dict]

    def data(self) -> list[Path]:
        """What a run writes before its report."""
        return [
            p
            for p in self.run_dir.rglob("*")
            if p.relative_to(self.run_dir).parts[0] not in REPORT_FILES
        ]

    def report(self) -> list[Path]:
        return [
            p
            for p in self.run_dir.rglob("*")
            if p.relative_to(self.run_dir).parts[0] in REPORT_FILES
        ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """An uninterrupted run (its $CTS_HOME keeps the search index for the others)."""
    root = tmp_path_factory.mktemp("reference")
    result = cts(run_args(root / "run", root / "cache"), root / "home")
    assert result.returncode == 0, result.stderr[-3000:]
    records = comparable(root / "run")
    assert len(records) == TOTAL
    return Reference(root / "home", root / "run", records)


Leave = Callable[[Reference, int], int]

SCENARIOS: dict[str, tuple[bool, Leave]] = {
    # (the caches on the full disk too, how much space to leave)
    "config": (True, lambda ref, page: 0),
    # Room for the config only: the response cache opened next finds none.
    "cache": (True, lambda ref, page: pages([ref.run_dir / "config.yaml"], page) + page),
    "records": (False, lambda ref, page: pages(ref.data(), page) // 2),
    "report": (False, lambda ref, page: pages(ref.data(), page) + pages(ref.report(), page) // 2),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_full_disk_stops_the_run_with_a_clear_error_and_it_resumes_once_freed(
    scenario: str, mounted: Disk | None, tmp_path: Path, reference: Reference
) -> None:
    if mounted is None:  # passed in a namespace
        return
    with_caches, leave = SCENARIOS[scenario]
    run_dir = mounted.root / "run"
    cache_dir = (mounted.root if with_caches else tmp_path) / "cache"
    mounted.fill(leave(reference, mounted.page))

    stopped = cts(run_args(run_dir, cache_dir), reference.home)
    assert stopped.returncode == 1, stopped.stdout[-2000:] + stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stdout + stopped.stderr
    message = stopped.stderr.strip().splitlines()[-1]
    assert message.startswith(f"storage error: {mounted.root}/"), message
    assert "No space left on device" in message
    failed = Path(message.removeprefix("storage error: ").split(":")[0])
    kept = check_nothing_torn(mounted.root, run_dir)
    recorded = len(RecordStore(run_dir).completed())
    if scenario == "config":
        assert failed == run_dir / "config.yaml" and not failed.exists()
    if scenario == "cache":
        assert failed.parent == cache_dir and recorded == 0
    if scenario == "records":  # mid-run: some records kept, the keys in flight not
        assert 0 < recorded < TOTAL
    if scenario == "report":  # every record, then the report's own writes
        assert recorded == TOTAL
        assert failed.relative_to(run_dir).parts[0] in REPORT_FILES

    mounted.make_room()
    resumed = cts(run_args(run_dir, cache_dir), reference.home)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{TOTAL - recorded} records written, {recorded} already done" in resumed.stdout
    check_nothing_torn(mounted.root, run_dir)
    check_kept(kept)
    assert comparable(run_dir) == reference.records
    json.loads(RunDir(run_dir).summary.read_text())


# -- each writer on a full disk -----------------------------------------------------------------


def test_a_write_cut_short_by_a_full_disk_leaves_the_old_file_or_none(mounted: Disk | None) -> None:
    if mounted is None:  # passed in a namespace
        return
    old = mounted.root / "old.json"
    write_whole(old, '{"old": true}')
    mounted.fill(mounted.page)  # one page: a larger write starts, then fails
    big = "x" * (3 * mounted.page)
    for path in (old, mounted.root / "sub" / "new.json"):
        with pytest.raises(StorageFull) as raised:
            write_whole(path, big)
        assert str(path) in str(raised.value) and "No space left on device" in str(raised.value)
    assert old.read_text() == '{"old": true}'
    assert not (mounted.root / "sub" / "new.json").exists()
    assert sorted(p.name for p in mounted.root.rglob("*")) == ["filler", "old.json", "sub"]


def test_an_append_cut_short_by_a_full_disk_leaves_no_torn_line(mounted: Disk | None) -> None:
    if mounted is None:  # passed in a namespace
        return
    path = mounted.root / "lines.jsonl"
    append_line(path, b'{"n": 1}\n')
    mounted.fill(0)
    # The file's page has room for part of the line: the kernel writes that much, then fails.
    with pytest.raises(StorageFull, match="No space left on device"):
        append_line(path, b'{"n": "' + b"2" * mounted.page + b'"}\n')
    assert path.read_bytes() == b'{"n": 1}\n'


def test_every_run_writer_on_a_full_disk_raises_storage_full_naming_its_file(
    mounted: Disk | None,
) -> None:
    if mounted is None:  # passed in a namespace
        return
    root = mounted.root
    records = RecordStore(root / "run")
    dialogues = DialogueStore(root / "run" / "dialogues", "shard-0-of-1")
    responses = ResponseCache(root / "responses.sqlite")
    tools = ToolCache(root / "tools.sqlite")
    record = Record(instance_id="q1", condition="blurred", seed=0, answer="a" * mounted.page)
    records.append(record.model_copy(update={"answer": "first"}), Shard())
    mounted.fill(0)
    resolved = load_experiment(None, ["dataset.limit=1"])
    writes: dict[Path, Callable[[], object]] = {
        records.path("blurred", Shard()): lambda: records.append(record, Shard()),
        dialogues.path: lambda: dialogues.append(
            Dialogue(instance_id="q1", seed=0, fingerprint="f" * mounted.page)
        ),
        root / "run" / "config.yaml": lambda: RunDir(root / "run").write_config(resolved),
        root / "responses.sqlite": lambda: responses.put(
            "k", "e", ChatResponse(text="t" * mounted.page)
        ),
        root / "tools.sqlite": lambda: tools.put("search", "local", {"q": 1}, "r" * 40_000),
    }
    try:
        for path, write in writes.items():
            with pytest.raises(StorageFull) as raised:
                write()
            assert raised.value.filename == str(path)
    finally:
        responses.close()
        tools.close()
    check_nothing_torn(root, root / "run")
    assert [r.answer for r in records.completed().values()] == ["first"]


def test_a_full_disk_inside_a_key_stops_the_run_and_records_nothing_for_it(
    mounted: Disk | None, tmp_path: Path, search
) -> None:
    """A trace that cannot be written is not the key's `internal` failure: the run stops, the
    key stays unrecorded and runs again on resume."""
    if mounted is None:  # passed in a namespace
        return
    ctx, _ = context(search, mounted.root / "traces")
    store = RecordStore(tmp_path / "run")  # the records have room, the traces none
    mounted.fill(0)

    def work(i, c, s):  # type: ignore[no-untyped-def]
        return run_instance(i, c, s, ctx)

    with pytest.raises(StorageFull, match="No space left on device"):
        asyncio.run(run_keys(instances(2), ["oracle"], [0], work, store))
    assert store.completed() == {}
    mounted.make_room()
    again = asyncio.run(run_keys(instances(2), ["oracle"], [0], work, store))
    assert again.ran == 2 and not again.failures


def test_a_run_into_a_read_only_file_system_stops_at_its_first_write(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """One clear stop naming the file and saying what to do, not a traceback, nor an
    `internal` failure per key."""
    if ran_in_a_namespace(request, tmp_path):
        return
    with tmpfs(tmp_path / "ro", "ro,size=1m") as root:
        stopped = cts(run_args(root / "run", tmp_path / "cache"), tmp_path / "home")
    assert stopped.returncode == 1, stopped.stdout[-2000:] + stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stdout + stopped.stderr
    message = stopped.stderr.strip().splitlines()[-1]
    assert message.startswith(f"storage error: {root}/run"), message
    assert "Read-only file system" in message and "make it writable" in message


def test_a_directory_one_may_not_write_is_a_storage_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EACCES, as a user who does not own the run directory meets it (root never does, so the
    refusal is injected where the write opens its file)."""
    import errno

    def refuse(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(StorageFull) as stopped:
        append_line(tmp_path / "records.jsonl", b"{}\n")
    assert str(stopped.value).startswith(f"{tmp_path / 'records.jsonl'}: Permission denied")
    assert "make it writable" in str(stopped.value)


@pytest.mark.parametrize(
    ("code", "remedy"),
    [
        (errno.EIO, "check the file system, or its server"),
        (errno.ESTALE, "check the file system, or its server"),
        (errno.ENOTDIR, "choose a path whose folders are folders"),
        (errno.EEXIST, "choose a path whose folders are folders"),
    ],
)
def test_a_storage_that_fails_stops_the_run_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, search, code: int, remedy: str
) -> None:
    """An I/O error, a stale NFS handle, a path through a file: every key became an `internal`
    failure, or a traceback. Now one stop naming the file and what to do, nothing recorded for
    the key (it runs again on resume once the storage works)."""
    import cts.foundation.disk as disk_module

    ctx, _ = context(search, tmp_path / "traces")
    store = RecordStore(tmp_path / "run")
    real = disk_module.os.replace

    def failing(source, target):  # type: ignore[no-untyped-def]
        if "traces" in str(target):
            raise OSError(code, os.strerror(code), str(target))
        return real(source, target)

    monkeypatch.setattr(disk_module.os, "replace", failing)

    def work(i, c, s):  # type: ignore[no-untyped-def]
        return run_instance(i, c, s, ctx)

    with pytest.raises(StorageFull) as stopped:
        asyncio.run(run_keys(instances(1), ["oracle"], [0], work, store))
    assert str(stopped.value).startswith(str(tmp_path / "traces")), str(stopped.value)
    assert os.strerror(code) in str(stopped.value) and remedy in str(stopped.value)
    assert store.completed() == {}
    monkeypatch.setattr(disk_module.os, "replace", real)
    again = asyncio.run(run_keys(instances(1), ["oracle"], [0], work, store))
    assert again.ran == 1 and not again.failures
