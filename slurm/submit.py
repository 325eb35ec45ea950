"""`cts slurm submit`: an evaluation array job (each task serves its models on its GPUs and runs
shard $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT) and a merge job that starts only when
every task succeeded (`afterok`).

Safety: sbatch options go to `sbatch` as separate arguments (never through a shell), and every
value inside a rendered script is shell-quoted, so a partition, path or override containing
quotes, `$()`, `;` or spaces runs nothing unintended. The experiment is frozen into the run
directory at submit time, so every shard (and a requeued one) runs the same config.

Preemption: jobs are submitted with `--requeue`; `cts run` finishes on SIGTERM with every
completed record on disk, and a restarted task resumes its shard.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from eval.config import ResolvedExperiment

#: Seconds before the time limit at which Slurm sends SIGTERM to the batch script, so `cts run`
#: stops cleanly (and records are complete) before it is killed.
SIGTERM_GRACE_S = 120


class SubmitError(RuntimeError):
    """sbatch refused a job; the message has its stderr."""


@dataclass
class SlurmOptions:
    shards: int
    partition: str | None = None
    gpus_per_task: int = 0
    cpus_per_task: int | None = None
    mem: str | None = None
    time: str | None = None
    account: str | None = None
    array_parallelism: int | None = None
    #: `cts run --serve` flags for the array task (the CPU build in CI).
    cpu: bool = False
    vllm_python: str | None = None
    extra_sbatch: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError(f"--shards must be at least 1, got {self.shards}")
        for name in ("partition", "time", "account", "mem"):
            value = getattr(self, name)
            # Each is one sbatch argument: no shell sees it, but a newline would still make a
            # confusing job; refuse control characters outright.
            if value is not None and (not value or re.search(r"[\x00-\x1f]", value)):
                raise ValueError(f"--{name.replace('_', '-')} {value!r}: not a valid value")

    def common_args(self) -> list[str]:
        args = ["--parsable", "--requeue"]
        for flag, value in (
            ("--partition", self.partition),
            ("--time", self.time),
            ("--account", self.account),
        ):
            if value is not None:
                args.append(f"{flag}={value}")
        return args

    def eval_args(self) -> list[str]:
        array = f"0-{self.shards - 1}"
        if self.array_parallelism:
            array += f"%{self.array_parallelism}"
        args = [*self.common_args(), f"--array={array}", f"--signal=B:TERM@{SIGTERM_GRACE_S}"]
        if self.gpus_per_task:
            args.append(f"--gpus-per-task={self.gpus_per_task}")
        if self.cpus_per_task:
            args.append(f"--cpus-per-task={self.cpus_per_task}")
        if self.mem:
            args.append(f"--mem={self.mem}")
        return [*args, *self.extra_sbatch]


def render(name: str, **values: str) -> str:
    """Fill the `@@key@@` slots of templates/<name> (plain bash otherwise, so `$VAR` stays as
    written). Values must already be shell-quoted."""
    text = resources.files("slurm").joinpath("templates", name).read_text("utf-8")
    slots = set(re.findall(r"@@(\w+)@@", text))
    if slots != set(values):
        raise ValueError(f"template {name} has slots {sorted(slots)}, got {sorted(values)}")
    return re.sub(r"@@(\w+)@@", lambda m: values[m.group(1)], text)


def cts_command() -> list[str]:
    """How a job runs `cts`: this interpreter, so the job uses the same environment."""
    return [sys.executable, "-m", "cts"]


def freeze_experiment(resolved: ResolvedExperiment, run_dir: Path) -> dict[str, object]:
    """The experiment with every model config inlined and the run directory fixed: what every
    shard runs, whatever is edited after submission."""
    # None is kept: `split: null` must not fall back to the default split.
    experiment = resolved.experiment.model_dump(mode="json")
    experiment["models"] = {k: m.model_dump(mode="json") for k, m in resolved.model_configs.items()}
    experiment["output_dir"] = str(run_dir)
    return experiment


def render_eval(experiment_file: Path, run_dir: Path, options: SlurmOptions, workdir: Path) -> str:
    serve = ["--serve"]
    if options.cpu:
        serve.append("--cpu")
    if options.vllm_python:
        serve += ["--vllm-python", options.vllm_python]
    run = [
        *cts_command(),
        "run",
        "--config",
        str(experiment_file),
        "--output-dir",
        str(run_dir),
        *serve,
    ]
    return render(
        "eval_array.sbatch", workdir=shlex.quote(str(workdir)), run_command=shlex.join(run)
    )


def render_merge(run_dir: Path, workdir: Path) -> str:
    return render(
        "merge.sbatch",
        workdir=shlex.quote(str(workdir)),
        merge_command=shlex.join([*cts_command(), "merge", str(run_dir)]),
    )


def sbatch(args: list[str], script: Path) -> str:
    """Submit; the job id (`--parsable` prints `id[;cluster]`)."""
    result = subprocess.run(
        ["sbatch", *args, str(script)], capture_output=True, text=True, timeout=120
    )
    if result.returncode != 0:
        raise SubmitError(f"sbatch {shlex.join(args)} {script} failed: {result.stderr.strip()}")
    return result.stdout.strip().split(";")[0]


@dataclass
class Submission:
    submitted_at: str
    shards: int
    eval_job: str | None
    merge_job: str | None
    scripts: dict[str, str]
    commands: dict[str, list[str]]


def submit(
    resolved: ResolvedExperiment,
    run_dir: Path,
    options: SlurmOptions,
    dry_run: bool = False,
    workdir: Path | None = None,
) -> Submission:
    """Render the scripts into RUN_DIR/slurm/, submit them (unless `dry_run`) and record the
    job ids in RUN_DIR/slurm/jobs.json."""
    run_dir = run_dir.resolve()
    workdir = (workdir or Path.cwd()).resolve()
    slurm_dir = run_dir / "slurm"
    logs = slurm_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    experiment_file = slurm_dir / "experiment.yaml"
    experiment_file.write_text(
        yaml.safe_dump(freeze_experiment(resolved, run_dir), sort_keys=False, allow_unicode=True)
    )
    eval_script = slurm_dir / "eval.sbatch"
    merge_script = slurm_dir / "merge.sbatch"
    eval_script.write_text(render_eval(experiment_file, run_dir, options, workdir))
    merge_script.write_text(render_merge(run_dir, workdir))
    name = resolved.experiment.name
    eval_args = [
        *options.eval_args(),
        f"--job-name=cts-{name}",
        f"--output={logs}/eval-%A_%a.out",
        f"--chdir={workdir}",
    ]
    merge_args = [
        *options.common_args(),
        f"--job-name=cts-{name}-merge",
        f"--output={logs}/merge-%j.out",
        f"--chdir={workdir}",
    ]
    submission = Submission(
        submitted_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        shards=options.shards,
        eval_job=None,
        merge_job=None,
        scripts={"eval": str(eval_script), "merge": str(merge_script)},
        commands={
            "eval": ["sbatch", *eval_args, str(eval_script)],
            "merge": ["sbatch", *merge_args, "--dependency=afterok:<eval job>", str(merge_script)],
        },
    )
    if dry_run:
        return submission
    submission.eval_job = sbatch(eval_args, eval_script)
    merge_args.append(f"--dependency=afterok:{submission.eval_job}")
    submission.commands["merge"] = ["sbatch", *merge_args, str(merge_script)]
    submission.merge_job = sbatch(merge_args, merge_script)
    record_submission(slurm_dir / "jobs.json", submission)
    return submission


def record_submission(path: Path, submission: Submission) -> None:
    """Append to the run's submission history (a resubmission after a failure adds a line)."""
    history = json.loads(path.read_text()) if path.is_file() else []
    history.append(asdict(submission))
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(history, indent=1))
    os.replace(partial, path)


def submissions(run_dir: Path) -> list[dict[str, object]]:
    path = run_dir / "slurm" / "jobs.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no Slurm submission recorded for this run directory")
    return list(json.loads(path.read_text()))
