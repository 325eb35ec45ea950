"""Kill the runner with SIGKILL at random points, or stop it with SIGTERM as Slurm does on
preemption, and resume each time: the final records equal an uninterrupted run's, with no key
missing or twice."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.run.records import RecordStore, merge
from cts.eval.run.run_dir import Shard
from tests.crash_runner import CONDITIONS, LIMIT

ROOT = Path(__file__).resolve().parents[2]


def start(
    run_dir: Path, index_dir: Path, shard: str = "all", *stop: str, **env: str
) -> subprocess.Popen:
    """tests/crash_runner.py on `shard`; `stop`: `--kill-at-call N`; `env`: more variables."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash_runner", str(run_dir), str(index_dir), shard, *stop],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def finish(run_dir: Path, index_dir: Path) -> None:
    process = start(run_dir, index_dir)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 0, err.decode()[-2000:]


def records(run_dir: Path) -> dict:
    instances = load_instances(DatasetSource(path="sample", split="dev", limit=LIMIT))
    report = merge(RecordStore(run_dir), instances, CONDITIONS, [0])
    assert report.ok, (report.missing, report.duplicates)
    return {k: r.model_dump(exclude={"seconds"}) for k, r in report.records.items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict]:
    """(search index dir, records of an uninterrupted run)."""
    root = tmp_path_factory.mktemp("reference")
    finish(root / "run", root / "index")
    expected = records(root / "run")
    assert len(expected) == LIMIT * len(CONDITIONS)
    return root / "index", expected


def recorded_lines(run_dir: Path) -> list[str]:
    return [
        line
        for f in sorted(run_dir.glob("records/*/*.jsonl"))
        for line in f.read_text().splitlines()
    ]


def test_sigkill_at_random_points_then_resume(tmp_path, reference):
    """Killed 24 times, each start a random shard of a random shard count (a run resharded
    between preemptions) killed at a random model call (other keys' calls and record writes in
    flight), then finished unsharded: every key exactly once, and the records of an
    uninterrupted run. The kill point is a call count, not a time, so every start is killed on
    any machine: a key makes at least 3 calls (search, answer, judge), so a start on a shard
    with P keys left, killed at a call drawn from 1..3P, cannot finish it first."""
    index, expected = reference

    rng = random.Random(11)
    run_dir = tmp_path / "killed"
    for _ in range(24):
        shard = rng.choice(["all", "0/2", "1/2", "0/3", "2/3"])
        if not pending(run_dir, shard):
            shard = "all"  # never empty: no start can finish what it was given
        at = rng.randint(1, 3 * pending(run_dir, shard))
        process = start(run_dir, index, shard, "--kill-at-call", str(at))
        _, err = process.communicate(timeout=300)
        assert process.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert 0 < pending(run_dir, "all") < len(expected)  # killed at points all through the run
    finish(run_dir, index)
    assert records(run_dir) == expected


def pending(run_dir: Path, shard: str) -> int:
    """Keys of `shard` not yet recorded in `run_dir`."""
    instances = load_instances(DatasetSource(path="sample", split="dev", limit=LIMIT))
    chosen = instances if shard == "all" else Shard.parse(shard).select(instances)
    done = set(RecordStore(run_dir).completed())
    return sum((i.id, c, 0) not in done for i in chosen for c in CONDITIONS)


def test_sigterm_flushes_finished_records_exits_130_and_resumes(tmp_path, reference):
    """SIGTERM while keys are under way: once 5 records are written every model call waits
    (so the run cannot finish first, however fast the machine), and it is stopped there."""
    index, expected = reference
    run_dir = tmp_path / "stopped"
    process = start(run_dir, index, "all", "--hold-at-records", "5")
    deadline = time.monotonic() + 300  # a hang guard, not a speed assumption
    while not (run_dir / "held").exists():
        assert process.poll() is None and time.monotonic() < deadline, "the run never held"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err.decode()[-2000:]
    kept = recorded_lines(run_dir)
    assert 5 <= len(kept) < len(expected)
    assert all(json.loads(line)["instance_id"] for line in kept)  # every line whole
    finish(run_dir, index)
    assert records(run_dir) == expected
    # The kept lines are untouched: the resumed run added only what was missing.
    assert set(kept) <= set(recorded_lines(run_dir))
