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

from eval.dataset import DatasetSource, load_instances
from eval.runner import RecordStore, merge
from tests.crash_runner import CONDITIONS, LIMIT

ROOT = Path(__file__).resolve().parent.parent


def start(run_dir: Path, index_dir: Path, shard: str | None = None) -> subprocess.Popen:
    shard_arg = [shard] if shard else []
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash_runner", str(run_dir), str(index_dir), *shard_arg],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
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
    """Killed at ≥ 20 random points, each start a random shard of a random shard count (a run
    resharded between preemptions), then finished unsharded: every key exactly once, and the
    records of an uninterrupted run."""
    index, expected = reference

    rng = random.Random(11)
    run_dir = tmp_path / "killed"
    kills = 0
    for _ in range(24):
        process = start(run_dir, index, rng.choice([None, "0/2", "1/2", "0/3", "2/3"]))
        time.sleep(rng.uniform(0.8, 1.8))  # start-up takes about 1 s
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.wait(timeout=60)
    finish(run_dir, index)
    assert kills >= 20
    assert records(run_dir) == expected


def test_sigterm_flushes_finished_records_exits_130_and_resumes(tmp_path, reference):
    index, expected = reference
    run_dir = tmp_path / "stopped"
    process = start(run_dir, index)
    deadline = time.monotonic() + 120
    while len(recorded_lines(run_dir)) < 5:
        assert process.poll() is None and time.monotonic() < deadline, "no records appeared"
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
