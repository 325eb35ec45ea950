"""config.yaml has one writer at a time: two starts with other configs on one run directory at
once each found no config.yaml and wrote their own, so the records were one run's while
config.yaml said the other's (a resume with the true config was then refused)."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

import pytest

from cts.eval.run import run_dir as run_dir_module
from cts.eval.run.config import load_experiment
from cts.eval.run.run_dir import RunDir
from cts.foundation.yaml_config import ConfigError


def test_two_starts_with_other_configs_at_once_leave_one_config_and_refuse_the_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Driven, not timed: the first writer is held between its check and its write until the
    second has either asked for the config lock (then it must wait for the first) or written
    its own config (what happened without a lock)."""
    first = load_experiment(None, ["search.top_k=3"])
    second = load_experiment(None, ["search.top_k=5"])
    run = RunDir(tmp_path / "run")
    held, asked, second_done = threading.Event(), threading.Event(), threading.Event()
    results: dict[str, str] = {}
    real_write, real_flock = run_dir_module.write_whole, fcntl.flock

    def write(path, text):  # type: ignore[no-untyped-def]
        if threading.current_thread().name == "first":
            held.set()
            while not (asked.is_set() or second_done.is_set()):  # points of progress
                threading.Event().wait(0.01)
        return real_write(path, text)

    def flock(handle, operation):  # type: ignore[no-untyped-def]
        if threading.current_thread().name == "second" and operation & fcntl.LOCK_EX:
            asked.set()
        return real_flock(handle, operation)

    monkeypatch.setattr(run_dir_module, "write_whole", write)
    monkeypatch.setattr(fcntl, "flock", flock)

    def start(name: str, resolved) -> None:  # type: ignore[no-untyped-def]
        try:
            run.write_config(resolved)
            results[name] = "written"
        except ConfigError as e:
            results[name] = str(e)
        finally:
            if name == "second":
                second_done.set()

    one = threading.Thread(target=start, args=("first", first), name="first")
    two = threading.Thread(target=start, args=("second", second), name="second")
    one.start()
    held.wait(60)  # the first has checked (no config.yaml yet) and is about to write
    two.start()
    one.join(60)
    two.join(60)
    assert results["first"] == "written"
    assert "search.top_k: 3 → 5" in results["second"], results
    assert "top_k: 3" in run.config.read_text()
