"""`cts slurm status RUN_DIR`: per-shard progress from the records, and each job's Slurm state
(from `scontrol show job`, which knows finished jobs for a while without slurmdbd)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cts.eval.construct.store import BUILD_STEPS, BuildFileError, BuildRow, RowStore
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.golden import GOLDEN
from cts.eval.run.config import load_experiment
from cts.eval.run.records import RecordFileError, RecordStore
from cts.eval.run.run_dir import RunDir, Shard
from cts.slurm.history import latest_chain, submissions


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
    if submission["kind"] in BUILD_STEPS:
        return _build_progress(submission)
    # The frozen experiment of the submission (RunDir.freeze): the dataset the shards cover.
    if submission["keys_per_instance"] is None:
        # A chain's step: the run's own config, written when its run starts.
        run = RunDir(Path(str(submission["records_dir"])))
        if not run.config.is_file():
            return []
        frozen = run.read_config()
    else:
        frozen = load_experiment(Path(str(submission["experiment"])))
    experiment = frozen.experiment
    instances = load_instances(as_the_jobs_read_it(experiment.dataset, submit_dir(submission)))
    # The keys the shard's task runs (as `cts run` counts what is already done): a golden
    # build's one record per instance, else each condition and seed.
    if submission["kind"] == "golden":
        conditions, seeds = [GOLDEN], [experiment.golden.seed]
    else:
        conditions, seeds = list(experiment.conditions), list(experiment.seeds)
    store = RecordStore(Path(str(submission["records_dir"])))
    rows = []
    shards = int(submission["shards"])
    for index in range(shards):
        shard = Shard(index, shards)
        mine = {i.id for i in shard.select(instances)}
        expected = len(mine) * len(conditions) * len(seeds)
        try:
            # Its own file and those of the run's other shard counts (a resharded resume);
            # only its keys: a lowered dataset.limit leaves records of instances it no
            # longer covers.
            records = [
                r
                for key, r in store.completed_for(shard).items()
                if key[0] in mine and key[1] in conditions and key[2] in seeds
            ]
        except RecordFileError as e:
            rows.append(ShardProgress(shard, 0, expected, 0, None, str(e)))
            continue
        failed = sum(1 for r in records if r.error is not None)
        rows.append(ShardProgress(shard, len(records), expected, failed, None))
    return rows


def submit_dir(submission: dict[str, Any]) -> Path | None:
    """The directory the submission's jobs run in (their --chdir: where it was submitted);
    None when it was not recorded."""
    if submission.get("workdir"):
        return Path(str(submission["workdir"]))
    for arg in (submission.get("commands") or {}).get("array", []):
        if str(arg).startswith("--chdir="):  # recorded before `workdir` was
            return Path(str(arg).split("=", 1)[1])
    return None


def as_the_jobs_read_it(dataset: DatasetSource, workdir: Path | None) -> DatasetSource:
    """The dataset with its relative local paths (file, corpus, gold table) made absolute
    against `workdir`: the jobs read them from there, and `cts slurm status` may be typed
    anywhere. A path that names nothing there (`sample`, a hub id) is kept as written."""
    if workdir is None:
        return dataset

    def anchored(path: str | None) -> str | None:
        if path is None or path == "sample" or path.startswith("~") or Path(path).is_absolute():
            return path
        return str(workdir / path) if (workdir / path).exists() else path

    gold = dataset.gold
    if gold is not None:
        gold = gold.model_copy(update={"path": anchored(gold.path)})
    update = {"path": anchored(dataset.path), "corpus": anchored(dataset.corpus), "gold": gold}
    return dataset.model_copy(update=update)


def _build_progress(submission: dict[str, Any]) -> list[ShardProgress]:
    """A fuse or blur job's rows per shard, against the keys its first task wrote (none
    before that)."""
    store = RowStore(Path(str(submission["records_dir"])), BuildRow)
    keys = store.read_keys()
    if keys is None:
        return []
    try:
        rows = store.rows()
    except BuildFileError as e:
        return [ShardProgress(Shard(0, 1), 0, len(keys), 0, None, str(e))]
    shards = int(submission["shards"])
    found = []
    for index in range(shards):
        shard = Shard(index, shards)
        mine = [rows[k] for k in shard.select(keys) if k in rows]
        failed = sum(r.error is not None for r in mine)
        found.append(ShardProgress(shard, len(mine), len(shard.select(keys)), failed, None))
    return found


def status(run_dir: Path) -> tuple[dict[str, Any], list[ShardProgress], JobState | None]:
    """The latest submission, its shards' progress and job states, and the final job's state."""
    latest = submissions(run_dir)[-1]
    tasks = job_states(str(latest["array_job"]))
    final = job_states(str(latest["final_job"])).get("")
    progress = shard_progress(latest)
    for p in progress:
        p.job = tasks.get(str(p.shard.index))
    return latest, progress, final


def servers_state(submission: dict[str, Any]) -> JobState | None:
    """The state of a submission's shared servers job (`--shared-servers`); None without one
    or once Slurm has forgotten it."""
    job = submission.get("servers_job")
    return job_states(str(job)).get("") if job else None


@dataclass
class StepStatus:
    """One job of a chain: its submission, its array tasks' and final job's states, and the
    progress of its records (none before its run has started)."""

    submission: dict[str, Any]
    tasks: dict[str, JobState]
    final: JobState | None
    progress: list[ShardProgress]

    def task_states(self) -> str:
        """`COMPLETED ×2, RUNNING ×1`, or `gone from Slurm`."""
        counts: dict[str, int] = {}
        for state in self.tasks.values():
            counts[state.state] = counts.get(state.state, 0) + 1
        return ", ".join(f"{k} ×{n}" for k, n in counts.items()) or "gone from Slurm"


def chain_status(run_dir: Path) -> list[StepStatus]:
    """Every job of the latest submission's chain (one for a single job), in order."""
    steps = []
    for submission in latest_chain(submissions(run_dir)):
        tasks = job_states(str(submission["array_job"]))
        final = job_states(str(submission["final_job"])).get("")
        progress = shard_progress(submission)
        for p in progress:
            p.job = tasks.get(str(p.shard.index))
        steps.append(StepStatus(submission, tasks, final, progress))
    return steps
