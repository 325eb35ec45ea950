"""Every writer that writes a file whole renames a temporary over it: over a device (`--out
/dev/null`, as root), a FIFO or a directory that would replace the special file itself. Such a
path is refused, naming what it is, before anything is written; a regular file, a symbolic
link to one and an absent path are written as before."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cts.cli import app
from cts.foundation.disk import NotAFile, write_whole
from cts.serving.server_group import write_endpoints
from cts.slurm.chain import Submission
from cts.slurm.history import record_submission
from cts.slurm.render import _write
from cts.train.pairs import _write as write_pairs


class _Servers:
    def endpoints(self) -> dict[str, object]:
        return {"models": {}}


def _submission() -> Submission:
    return Submission("run", "now", 1, "1", "2", {}, {}, "records", "x.yaml", 3)


#: Each writer that renames over its file, as (path) -> None.
WRITERS: dict[str, Callable[[Path], None]] = {
    "write_whole": lambda p: write_whole(p, "data"),
    "train pairs": lambda p: write_pairs(p, "data"),
    "endpoints file": lambda p: write_endpoints(p, _Servers()),  # type: ignore[arg-type]
    "slurm file": lambda p: _write(p, "data"),
    "slurm submissions": lambda p: record_submission(p, asdict(_submission())),
}


def _null_device(path: Path) -> Path:
    """A character device like /dev/null (1, 3), made in tmp_path: the test never risks the
    machine's own /dev/null."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs root (CAP_MKNOD)")
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _directory(path: Path) -> Path:
    path.mkdir()
    return path


def _link_to_fifo(path: Path) -> Path:
    target = _fifo(path.with_name("fifo-target"))
    path.symlink_to(target)
    return path


SPECIAL: dict[str, tuple[Callable[[Path], Path], Callable[[int], bool], str]] = {
    "char-device": (_null_device, stat.S_ISCHR, "a character device"),
    "fifo": (_fifo, stat.S_ISFIFO, "a FIFO"),
    "directory": (_directory, stat.S_ISDIR, "a directory"),
    "link-to-fifo": (_link_to_fifo, stat.S_ISFIFO, "a FIFO"),
}


@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("kind", list(SPECIAL))
def test_every_whole_file_writer_refuses_a_path_that_is_not_a_regular_file(tmp_path, writer, kind):
    make, still, named = SPECIAL[kind]
    path = make(tmp_path / "target")
    with pytest.raises(NotAFile, match=f"{path}: not a regular file \\({named}\\)"):
        WRITERS[writer](path)
    assert still(os.stat(path).st_mode), "the special file was replaced"
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []


@pytest.mark.parametrize("writer", list(WRITERS))
def test_regular_files_links_to_them_and_absent_paths_are_still_written(tmp_path, writer):
    regular = tmp_path / "regular"
    regular.write_text("[]")  # the submissions file reads what is there
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")  # dangling: absent
    for path in (regular, link, tmp_path / "new" / "absent"):
        WRITERS[writer](path)
        assert path.is_file() and path.read_text() != "[]"


def test_cts_estimate_out_a_fifo_exits_2_before_any_work(tmp_path):
    fifo = _fifo(tmp_path / "fifo")
    result = CliRunner().invoke(
        app, ["estimate", "--from-run", str(tmp_path / "none"), "--out", str(fifo)]
    )
    assert result.exit_code == 2, result.output
    assert f"{fifo}: not a regular file (a FIFO)" in result.output
    assert "Traceback" not in result.output and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_run_whose_trace_path_is_a_fifo_stops_with_the_error(tmp_path):
    """Not every key's `internal` failure: the run stops once, exit 2, keys unrecorded."""
    from tests.scripted_cts import cts

    run_dir = tmp_path / "run"
    args = [
        "run",
        "--output-dir",
        str(run_dir),
        "--limit",
        "1",
        "--set",
        "conditions=[blurred]",
        "--set",
        f"cache.path={tmp_path / 'r.sqlite'}",
        "--set",
        f"search.tool_cache={tmp_path / 't.sqlite'}",
    ]
    first = cts(args, tmp_path / "home")
    assert first.returncode == 0, first.stderr[-2000:]
    (trace,) = (run_dir / "traces").rglob("*.json")
    trace.unlink()
    _fifo(trace)
    for shard in (run_dir / "records").rglob("*.jsonl"):
        shard.unlink()
    again = cts(args, tmp_path / "home")
    assert again.returncode == 2, again.stdout + again.stderr
    assert "not a regular file (a FIFO)" in again.stderr
    assert all(not f.read_text() for f in (run_dir / "records").rglob("*.jsonl"))
