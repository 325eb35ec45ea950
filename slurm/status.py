"""`cts slurm status RUN_DIR`: per-shard progress from the records, and each job's Slurm state
(from `scontrol show job`, which knows finished jobs for a while without slurmdbd)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.config import load_experiment
from eval.dataset import load_instances
from eval.runner import RecordFileError, RecordStore, Shard
from slurm.submit import submissions


@dataclass
class JobState:
    state: str
    reason: str = ""
    exit_code: str = ""


def _fields(line: str) -> dict[str, str]:
    out = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value
    return out


def job_states(job_id: str) -> dict[str, JobState]:
    """Array task id (or "" for a plain job) → state; empty when Slurm no longer knows it."""
    result = subprocess.run(
        ["scontrol", "show", "job", "--oneliner", job_id],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        return {}
    states = {}
    for line in result.stdout.splitlines():
        f = _fields(line)
        if "JobState" in f:
            state = JobState(f["JobState"], f.get("Reason", ""), f.get("ExitCode", ""))
            for task in task_ids(f.get("ArrayTaskId", "")):
                states[task] = state
    return states


def task_ids(text: str) -> list[str]:
    """Pending array tasks are shown together: `0-3%2`, `1,4-5` → each id."""
    ids: list[str] = []
    for part in text.split("%")[0].split(","):
        first, sep, last = part.partition("-")
        if sep and first.isdigit() and last.isdigit():
            ids += [str(i) for i in range(int(first), int(last) + 1)]
        else:
            ids.append(part)
    return ids


@dataclass
class ShardProgress:
    shard: Shard
    done: int
    expected: int
    failed: int
    job: JobState | None
    #: The shard's records could not be read (file:line: why).
    records_error: str | None = None


def shard_progress(submission: dict[str, Any]) -> list[ShardProgress]:
    """Records done, expected and failed for each shard (job states are filled in later)."""
    # The frozen experiment of the submission (RunDir.freeze): the dataset the shards cover.
    frozen = load_experiment(Path(str(submission["experiment"])))
    instances = load_instances(frozen.experiment.dataset)
    per_instance = int(submission["keys_per_instance"])
    store = RecordStore(Path(str(submission["records_dir"])))
    rows = []
    shards = int(submission["shards"])
    for index in range(shards):
        shard = Shard(index, shards)
        expected = len(shard.select(instances)) * per_instance
        try:
            records = store.completed(shard)
        except RecordFileError as e:
            rows.append(ShardProgress(shard, 0, expected, 0, None, str(e)))
            continue
        failed = sum(1 for r in records.values() if r.error is not None)
        rows.append(ShardProgress(shard, len(records), expected, failed, None))
    return rows


def status(run_dir: Path) -> tuple[dict[str, Any], list[ShardProgress], JobState | None]:
    """The latest submission, its shards' progress and job states, and the final job's state."""
    latest = submissions(run_dir)[-1]
    tasks = job_states(str(latest["array_job"]))
    final = job_states(str(latest["final_job"])).get("")
    progress = shard_progress(latest)
    for p in progress:
        p.job = tasks.get(str(p.shard.index))
    return latest, progress, final
