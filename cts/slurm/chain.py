"""Submitting planned jobs: each array job and the final job that starts only when every task
succeeded (afterok), a chain's jobs each after the one before, a shared servers job before its
array and the job that stops it after; cancelling what a refused submission had already queued;
refusing a submission that would change what live jobs read; and recording the job ids in the
run's jobs.json (its submission history).

Preemption: jobs are submitted with `--requeue`; a sharded command finishes on SIGTERM with
every completed record on disk, and a restarted task resumes its shard.

Apart from the plan (cts.slurm.plan) and the scripts (cts.slurm.render): this is the only module
that runs sbatch or scancel, and it changes with how Slurm takes, orders and refuses jobs.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
import time
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cts.eval.run.run_dir import RunDir
from cts.slurm.history import latest_chain, record_submission, submissions
from cts.slurm.plan import Job, SlurmOptionError, SlurmOptions
from cts.slurm.render import write_job, write_servers, write_stop

if TYPE_CHECKING:
    from collections.abc import Callable

    from cts.slurm.status import JobState

#: Slurm job states of a job that is still queued or running: it (or a requeue of it) will read
#: the frozen experiment of its run directory again.
LIVE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "CONFIGURING",
        "COMPLETING",
        "SUSPENDED",
        "STOPPED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "RESV_DEL_HOLD",
    }
)


class SubmitError(RuntimeError):
    """sbatch refused a job; the message has its stderr."""


def sbatch(args: list[str], script: Path) -> str:
    """Submit; the job id (`--parsable` prints `id[;cluster]`)."""
    try:
        result = subprocess.run(
            ["sbatch", *args, str(script)], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SubmitError(f"sbatch could not run: {e}") from None
    if result.returncode != 0:
        raise SubmitError(f"sbatch {shlex.join(args)} {script} failed: {result.stderr.strip()}")
    return result.stdout.strip().split(";")[0]


@dataclass
class Submission:
    kind: str
    submitted_at: str
    shards: int
    array_job: str | None
    final_job: str | None
    scripts: dict[str, str]
    commands: dict[str, list[str]]
    records_dir: str
    experiment: str
    #: None: counted from `experiment` (the run's own config) once the run has started.
    keys_per_instance: int | None
    #: A chain's step (`loop-eval-1`), its array's and final job's titles, and the chain it
    #: belongs to (its submission time; None for a single job).
    stage: str | None = None
    titles: list[str] = field(default_factory=list)
    chain: str | None = None
    #: `--shared-servers`: the job serving the shared models, and the one that stops it.
    servers_job: str | None = None
    stop_job: str | None = None
    #: Where the jobs run (their --chdir, the submit directory): relative paths of the frozen
    #: experiment are read from there.
    workdir: str | None = None


def live_jobs(run_dir: Path, job_states: Callable[[str], dict[str, JobState]]) -> list[str]:
    """The jobs of the run directory's latest submission (every job of its chain) that are
    still queued or running
    (`123_4` for an array task); none when nothing was submitted or Slurm cannot be asked."""
    if not RunDir(run_dir).jobs.is_file():
        return []
    live = []
    for job_id in (
        job_id
        for submission in latest_chain(submissions(run_dir))
        for job_id in (
            submission.get("array_job"),
            submission.get("final_job"),
            submission.get("servers_job"),
        )
    ):
        if not job_id:
            continue
        try:
            states = job_states(str(job_id))
        except (OSError, subprocess.SubprocessError):
            continue  # no scontrol: sbatch will not run either
        for task, state in sorted(states.items(), key=lambda t: (len(t[0]), t[0])):
            if state.state.split("+")[0] in LIVE_STATES:
                live.append(f"{job_id}_{task}" if task else str(job_id))
    return live


def latest_shards(run_dir: Path) -> int | None:
    """The shard count of the run directory's latest recorded submission; None without one."""
    if not RunDir(run_dir).jobs.is_file():
        return None
    return int(submissions(run_dir)[-1]["shards"])


def refuse_changing_live_jobs(
    job: Job,
    job_states: Callable[[str], dict[str, JobState]] | None = None,
    shards: int | None = None,
) -> None:
    """SlurmOptionError when the latest submission still has queued or running jobs and this
    one would change the frozen configs they (or a requeue of them) read, or run the same keys
    in another shard count (`shards`, None: not checked) beside them: each shard's lock is
    per shard file name, so two shard counts would both run every key and no merge could then
    pick one record per key."""
    changed = [
        job.slurm_dir / name
        for name, text in job.frozen.items()
        if (job.slurm_dir / name).is_file() and (job.slurm_dir / name).read_text() != text
    ]
    before = latest_shards(job.run_dir) if shards is not None else None
    resharded = before is not None and before != shards
    if not changed and not resharded:
        return
    if job_states is None:
        from cts.slurm.status import job_states as scontrol_states

        job_states = scontrol_states
    live = live_jobs(job.run_dir, job_states)
    if not live:
        return
    ids = sorted({j.split("_")[0] for j in live}, key=lambda j: (len(j), j))
    why = []
    if changed:
        why.append(
            f"read {', '.join(str(p) for p in changed)}; submitting another experiment would "
            "change what they (or a requeue of them) run"
        )
    if resharded:
        why.append(
            f"run it in {before} shard(s); --shards {shards} would run the same keys again into "
            "other shard files beside them, and every merge would then find them twice"
        )
    raise SlurmOptionError(
        f"{job.run_dir}: jobs {', '.join(live)} of the latest submission are still queued "
        f"or running and {', and '.join(why)}. Wait for them to finish, or "
        f"`scancel {' '.join(ids)}`, then submit again (or use another --output-dir)."
    )


def submit(
    job: Job,
    name: str,
    options: SlurmOptions,
    dry_run: bool = False,
    workdir: Path | None = None,
    job_states: Callable[[str], dict[str, JobState]] | None = None,
) -> Submission:
    """One job: `submit_chain` of it alone."""
    return submit_chain([job], name, options, dry_run, workdir, job_states)[0]


def submit_chain(
    jobs: list[Job],
    name: str,
    options: SlurmOptions,
    dry_run: bool = False,
    workdir: Path | None = None,
    job_states: Callable[[str], dict[str, JobState]] | None = None,
) -> list[Submission]:
    """Write the jobs' frozen configs and render their scripts into RUN_DIR/slurm/, submit
    them, each job's array after the job before it succeeded (afterok on its final job), and
    record the job ids in RUN_DIR/slurm/jobs.json.

    A dry run writes nothing into the run directory: configs and scripts go to a fresh
    temporary directory (the scripts' `--config` names the frozen config there). A real submit
    is refused (SlurmOptionError) when it would change the frozen configs of jobs that are
    still queued or running; `job_states` (job id -> task states, default `scontrol`) says
    which are."""
    workdir = (workdir or Path.cwd()).resolve()
    run = RunDir(jobs[0].run_dir)
    if dry_run:
        where = Path(tempfile.mkdtemp(prefix="cts-slurm-dry-run-"))
        jobs = [job.relocate(where) for job in jobs]
    else:
        refuse_changing_live_jobs(jobs[0], job_states, options.shards)
        run.slurm_logs.mkdir(parents=True, exist_ok=True)
    chain = time.strftime("%Y-%m-%dT%H:%M:%S%z") if len(jobs) > 1 else None
    done: list[Submission] = []
    for job in jobs:
        after = done[-1].final_job if done else None
        try:
            submission = _submit_one(job, name, options, workdir, dry_run, chain, bool(done), after)
        except SubmitError as refused:
            # The chain's earlier steps would run with nothing after them; they stay recorded
            # (cancelled), so a resubmitted chain does not run beside them.
            which = "the chain's earlier steps, which would run with nothing after them"
            raise withdrawn(refused, _chain_jobs(done), which) from None
        done.append(submission)
        if not dry_run:
            record_submission(run.jobs, asdict(submission))
    return done


def _chain_jobs(done: list[Submission]) -> list[str]:
    return [j for d in done for j in (d.servers_job, d.array_job, d.final_job, d.stop_job) if j]


def _submit_one(
    job: Job,
    name: str,
    options: SlurmOptions,
    workdir: Path,
    dry_run: bool,
    chain: str | None,
    follows: bool,
    after: str | None,
) -> Submission:
    array_script, final_script = write_job(job, workdir)
    array_args = [*options.array_args(), *_names(job, name, workdir, "", "%A_%a")]
    if follows:
        array_args.append(f"--dependency=afterok:{after or '<previous final job>'}")
    servers = _servers_submission(job, name, options, workdir) if job.shared else None
    if servers is not None:
        # The array's tasks start once the servers job has (then they wait for its endpoints).
        array_args.append(f"--dependency=after:{'<servers job>' if dry_run else servers.start()}")
    final_args = [
        *options.final_args(job.final_template == "train.sbatch"),
        *_names(job, name, workdir, "-final", "%j"),
    ]
    submission = Submission(
        kind=job.kind,
        submitted_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        shards=options.shards,
        array_job=None,
        final_job=None,
        scripts={"array": str(array_script), "final": str(final_script)},
        commands={
            "array": ["sbatch", *array_args, str(array_script)],
            "final": ["sbatch", *final_args, "--dependency=afterok:<array job>", str(final_script)],
        },
        records_dir=str(job.records_dir),
        experiment=str(job.experiment_file),
        keys_per_instance=job.keys_per_instance if job.keys_known else None,
        stage=job.label or None,
        titles=[job.array_title, job.final_title],
        chain=chain,
        workdir=str(workdir),
    )
    if servers is not None:
        submission.scripts.update(servers.scripts)
        submission.commands.update(servers.commands)
    if not dry_run:
        _sbatch_jobs(submission, servers, (array_args, array_script), (final_args, final_script))
    return submission


def _names(job: Job, name: str, workdir: Path, part: str, log: str) -> list[str]:
    """The job name, log file and working directory of one of `job`'s Slurm jobs: `part` tells
    which (the array's: none), `log` is its log file name's job id pattern."""
    logs = RunDir(job.run_dir).slurm_logs  # where the real jobs log (not created by a dry run)
    return [
        f"--job-name=cts-{job.name}-{name}{part}",
        f"--output={logs}/{job.name}{part}-{log}.out",
        f"--chdir={workdir}",
    ]


def _sbatch_jobs(
    submission: Submission,
    servers: _ServersSubmission | None,
    array: tuple[list[str], Path],
    final: tuple[list[str], Path],
) -> None:
    """Submit the array, the final job after it (afterok) and the job that stops the shared
    servers (started already), recording their ids in `submission`; a refusal cancels what this
    submission had already submitted."""
    (array_args, array_script), (final_args, final_script) = array, final
    try:
        submission.array_job = sbatch(array_args, array_script)
        final_args.append(f"--dependency=afterok:{submission.array_job}")
        submission.commands["final"] = ["sbatch", *final_args, str(final_script)]
        submission.final_job = sbatch(final_args, final_script)
        if servers is not None:
            submission.servers_job = servers.job_id
            submission.stop_job = servers.stop_after(submission.array_job)
            submission.commands.update(servers.commands)
    except SubmitError as refused:
        # What was taken would otherwise stay queued unrecorded: an array with no merge after
        # it, a servers job holding its GPUs with nothing to stop it.
        taken = [servers.job_id if servers else None, submission.array_job, submission.final_job]
        which = "this submission had already submitted them, and none is in jobs.json"
        raise withdrawn(refused, [j for j in taken if j], which) from None


def scancel(job_ids: list[str]) -> None:
    """Cancel jobs (best effort: a job that has already ended is no error)."""
    if job_ids:
        with suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["scancel", *job_ids], capture_output=True, timeout=60, check=False)


def withdrawn(refused: SubmitError, job_ids: list[str], which: str) -> SubmitError:
    """Cancel jobs submitted before sbatch refused another (`which` says what they were); the
    refusal, saying so."""
    if not job_ids:
        return refused
    scancel(job_ids)
    return SubmitError(
        f"{refused}\ncancelled job(s) {', '.join(job_ids)} (scancel): {which}; submit again "
        "once sbatch takes every job"
    )


@dataclass
class _ServersSubmission:
    """The shared servers job of a submission and the job that stops it: rendered when made,
    submitted by `start` (before the array) and `stop_after` (after it)."""

    job: Job
    args: list[str]
    stop_args: list[str]
    scripts: dict[str, str]
    commands: dict[str, list[str]]
    job_id: str | None = None

    def start(self) -> str:
        # A file left by a servers job that was killed would send the tasks to dead servers.
        assert self.job.shared is not None
        self.job.shared.endpoints.unlink(missing_ok=True)
        self.job_id = sbatch(self.args, Path(self.scripts["servers"]))
        return self.job_id

    def stop_after(self, array_job: str) -> str:
        """Cancel the servers job once every array task has ended, however (afterany)."""
        assert self.job_id is not None
        script = Path(self.scripts["stop"])
        write_stop(script, self.job_id)
        args = [*self.stop_args, f"--dependency=afterany:{array_job}"]
        self.commands["stop"] = ["sbatch", *args, str(script)]
        return sbatch(args, script)


def _servers_submission(
    job: Job, name: str, options: SlurmOptions, workdir: Path
) -> _ServersSubmission:
    servers_script, stop_script = write_servers(job, workdir)
    args = [*options.servers_args(), *_names(job, name, workdir, "-servers", "%j")]
    stop = [*options.stop_args(), *_names(job, name, workdir, "-stop-servers", "%j")]
    return _ServersSubmission(
        job,
        args,
        stop,
        scripts={"servers": str(servers_script), "stop": str(stop_script)},
        commands={
            "servers": ["sbatch", *args, str(servers_script)],
            "stop": ["sbatch", *stop, "--dependency=afterany:<array job>", str(stop_script)],
        },
    )
