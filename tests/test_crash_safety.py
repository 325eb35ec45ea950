"""Kill the runner with SIGKILL at random points, resume each time: the final records equal an
uninterrupted run's, with no key missing or twice."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from eval.dataset import DatasetSource, load_instances
from eval.runner import RecordStore, merge
from tests.crash_runner import CONDITIONS, LIMIT

ROOT = Path(__file__).resolve().parent.parent


def start(run_dir: Path, index_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash_runner", str(run_dir), str(index_dir)],
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


def test_sigkill_at_random_points_then_resume(tmp_path):
    index = tmp_path / "index"
    finish(tmp_path / "reference", index)
    expected = records(tmp_path / "reference")
    assert len(expected) == LIMIT * len(CONDITIONS)

    rng = random.Random(11)
    run_dir = tmp_path / "killed"
    kills = 0
    for _ in range(12):
        process = start(run_dir, index)
        time.sleep(rng.uniform(0.8, 2.0))  # start-up takes about 1 s
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.wait(timeout=60)
    finish(run_dir, index)
    assert kills >= 10
    assert records(run_dir) == expected
