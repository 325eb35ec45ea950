"""What a `cts slurm submit` asks of Slurm, before any script is written: the sbatch options
(shards, GPUs per task, CPUs and memory, time, account, array parallelism), checked when they are
made, with the GPU request every Slurm from 22.05 to 24.x takes; the `Job` a submission plans (the
sharded `cts` command of its array and the commands of its final job); and the shared servers
job of `--shared-servers`.

Apart from the job kinds (cts.slurm.kinds), the sbatch text (cts.slurm.render) and the submission
(cts.slurm.chain): the options and the shape of a job change with what Slurm accepts, not with
what a job runs, how its script reads or how it is submitted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.run_dir import RunDir
from cts.serving.server_plan import served_models

if TYPE_CHECKING:
    from collections.abc import Callable

#: Seconds before the time limit at which Slurm sends SIGTERM to the batch script, so `cts run`
#: stops cleanly (and records are complete) before it is killed.
SIGTERM_GRACE_S = 120


#: What a task asks per GPU when --cpus-per-task / --mem are not given. Site defaults are often
#: one core and a few GB per job: five vLLM servers (an API server, an engine core and a worker
#: per GPU each, every one importing torch) then miss their readiness deadline or are OOM-killed.
CPUS_PER_GPU = 4
MEM_GB_PER_GPU = 32

#: sbatch options that shape a GPU request; with --gpus-per-task cts sets them itself.
_GPU_SHAPE = re.compile(
    r"^(-n|-N|--ntasks|--nodes|--gpus|--gres=gpu|--tres-per-task|--cpus-per-gpu)"
)


def gpu_request(gpus: int) -> list[str]:
    """`gpus` GPUs for one task on one node, in the form every Slurm from 22.05 to 24.x takes:
    since 23.11 sbatch refuses --gpus-per-task without -n/--ntasks or --gpus ("--gpus-per-task
    or --tres-per-task used without either --gpus or -n/--ntasks is not allowed"), and --nodes
    keeps the task's GPUs on the node whose localhost its servers listen on."""
    return ["--nodes=1", "--ntasks=1", f"--gpus-per-task={gpus}"]


class SlurmOptionError(ValueError):
    """A submit option that sbatch must not be given (checked before anything is written)."""


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
    #: `--serve` flags for the array task (the CPU build in CI).
    cpu: bool = False
    vllm_python: str | None = None
    extra_sbatch: list[str] = field(default_factory=list)
    #: GPUs of the training job (`--job train`), which runs after the sampling array.
    fit_gpus: int = 1
    #: `--ready-timeout` of the array task's servers (None: the command's default).
    ready_timeout_s: float | None = None
    #: Roles whose models one job serves for every array task (`--shared-servers`), its GPUs
    #: (None: as many as an array task's) and its time limit (None: --time).
    shared_servers: list[str] = field(default_factory=list)
    shared_gpus: int | None = None
    shared_time: str | None = None

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise SlurmOptionError(f"--shards must be at least 1, got {self.shards}")
        # sbatch refuses a negative count (`--cpus-per-task=-4`, `--array=0-1%-1`), and a
        # parallelism of 0 would be dropped from --array without a word.
        for name, least in (
            ("gpus_per_task", 0),
            ("fit_gpus", 0),
            ("shared_gpus", 0),
            ("cpus_per_task", 1),
            ("array_parallelism", 1),
        ):
            count = getattr(self, name)
            if count is not None and count < least:
                raise SlurmOptionError(
                    f"--{name.replace('_', '-')} must be at least {least}, got {count}"
                )
        for name in ("partition", "time", "account", "mem", "shared_time"):
            value = getattr(self, name)
            # Each is one sbatch argument: no shell sees it, but a newline would still make a
            # confusing job; refuse control characters outright.
            if value is not None and (not value or re.search(r"[\x00-\x1f]", value)):
                raise SlurmOptionError(f"--{name.replace('_', '-')} {value!r}: not a valid value")
        shaping = [a for a in self.extra_sbatch if _GPU_SHAPE.match(a)]
        if self.gpus_per_task and shaping:
            raise SlurmOptionError(
                f"--sbatch-arg {' '.join(shaping)}: with --gpus-per-task, cts asks for the GPUs "
                f"itself ({' '.join(gpu_request(self.gpus_per_task))}); a second task count or "
                "GPU request would contradict it (newer Slurm refuses such mixes)"
            )

    def common_args(self, time: str | None = None) -> list[str]:
        args = ["--parsable", "--requeue"]
        for flag, value in (
            ("--partition", self.partition),
            ("--time", time or self.time),
            ("--account", self.account),
        ):
            if value is not None:
                args.append(f"{flag}={value}")
        return args

    def array_args(self) -> list[str]:
        array = f"0-{self.shards - 1}"
        if self.array_parallelism:
            array += f"%{self.array_parallelism}"
        args = [*self.common_args(), f"--array={array}", f"--signal=B:TERM@{SIGTERM_GRACE_S}"]
        if self.gpus_per_task:
            args += gpu_request(self.gpus_per_task)
        return [*args, *self._cpus_and_mem(self.gpus_per_task), *self.extra_sbatch]

    def _cpus_and_mem(self, gpus: int) -> list[str]:
        """The given requests; with GPUs and none given, CPUS_PER_GPU and MEM_GB_PER_GPU each."""
        args = []
        cpus = self.cpus_per_task or (CPUS_PER_GPU * gpus if gpus else None)
        mem = self.mem or (f"{MEM_GB_PER_GPU * gpus}G" if gpus else None)
        if cpus:
            args.append(f"--cpus-per-task={cpus}")
        if mem:
            args.append(f"--mem={mem}")
        return args

    def servers_args(self) -> list[str]:
        """The shared servers job: its GPUs, the array's CPU and memory requests per GPU, the
        sweep's time limit, and SIGTERM before it so that its servers stop cleanly."""
        gpus = self.gpus_per_task if self.shared_gpus is None else self.shared_gpus
        args = [*self.common_args(self.shared_time), f"--signal=B:TERM@{SIGTERM_GRACE_S}"]
        if gpus:
            args += gpu_request(gpus)
        return [*args, *self._cpus_and_mem(gpus), *self.extra_sbatch]

    def stop_args(self) -> list[str]:
        """The job that cancels the shared servers job: no GPU, a few minutes."""
        args = ["--parsable", "--time=5"]
        for flag, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None:
                args.append(f"{flag}={value}")
        return args

    def final_args(self, trains: bool) -> list[str]:
        """A merge needs no GPU; a training job gets `fit_gpus` and the array's CPU and memory
        requests, and SIGTERM before its time limit like the array tasks."""
        args = self.common_args()
        if trains:
            args.append(f"--signal=B:TERM@{SIGTERM_GRACE_S}")
            if self.fit_gpus:
                args += gpu_request(self.fit_gpus)
            args += self._cpus_and_mem(self.fit_gpus)
        return args


#: Where a shared servers job writes its endpoints file (RUN_DIR/slurm/).
SHARED_ENDPOINTS = "shared-endpoints.json"
#: Seconds an array task waits for that file beyond the servers' ready timeout (the servers job
#: has started when the task does: the array depends on it with `after`).
SHARED_WAIT_MARGIN_S = 300.0


@dataclass(frozen=True)
class SharedServers:
    """One job serving some models for every array task of a sweep, e.g. the judge and the
    User Answerer: 16 shards then load them once, not 16 times."""

    roles: list[str]
    #: Model keys of those roles (one server each, as `cts serve` plans them).
    models: list[str]
    endpoints: Path
    #: `cts serve` arguments of the servers job.
    serve_args: list[str]


def shared_servers(
    resolved: ResolvedExperiment, run_dir: Path, frozen: Path, options: SlurmOptions
) -> SharedServers | None:
    """The shared servers of `--shared-servers ROLES`, None without; SlurmOptionError for a
    role the experiment lacks or whose model is not served by vLLM."""
    if not options.shared_servers:
        return None
    served = served_models(resolved.model_configs)
    roles = {str(r): config for r, config in resolved.experiment.roles.items()}
    models: list[str] = []
    for role in options.shared_servers:
        if role not in roles:
            raise SlurmOptionError(
                f"--shared-servers {role}: the experiment has no role {role!r} "
                f"(its roles: {', '.join(roles)})"
            )
        key = roles[role].model
        if key not in served:
            engine = resolved.model_configs[key].engine
            raise SlurmOptionError(
                f"--shared-servers {role}: its model {key} is not served by vLLM (engine "
                f"{engine}); a shared server needs engine: openai with vllm.serve on"
            )
        models += [key] if key not in models else []
    endpoints = RunDir(run_dir).slurm / SHARED_ENDPOINTS
    where = ["--config", str(frozen), "--output-dir", str(run_dir), "--endpoints", str(endpoints)]
    # On every interface: the array's tasks may run on other nodes.
    serve = ["serve", *where, "--models", ",".join(models), "--host", "0.0.0.0"]
    serve += serve_flags(options)[1:]
    return SharedServers(list(options.shared_servers), models, endpoints, serve)


@dataclass(frozen=True)
class Job:
    """One submission: a sharded `cts` command as an array job (each task adds `--shard
    $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT`), then final commands that start only when
    every task succeeded (afterok)."""

    kind: Literal["eval", "golden", "rejudge", "train", "train-loop", "fuse", "blur"]
    run_dir: Path
    #: What the array and the final job are called in messages and job names.
    array_title: str
    final_title: str
    #: `cts` arguments of the sharded command (without --shard) and of the final commands.
    array_args: list[str]
    final_args: list[list[str]]
    #: The final job's template: merge.sbatch (CPU) or train.sbatch (GPUs).
    final_template: str
    #: For `cts slurm status`: where the array's records go, the frozen experiment whose
    #: dataset they cover, and how many records each instance gets.
    records_dir: Path
    experiment_file: Path
    keys_per_instance: int
    #: Where the frozen configs go (the args above name files in it) and their text, written
    #: by `submit`, not when the job is planned.
    slurm_dir: Path
    frozen: dict[str, str]
    #: The same job with its frozen configs in another directory (a dry run's).
    relocate: Callable[[Path], Job] = field(repr=False, compare=False)
    #: Names its scripts, Slurm job names and logs (the kind; a chain's step in a chain).
    label: str = ""
    #: None: counted from the run's own config.yaml in records_dir once the run has started
    #: (a loop's later steps run a clarifier that does not exist when they are submitted).
    keys_known: bool = True
    #: Models one job serves for all the array's tasks (`--shared-servers`), or None.
    shared: SharedServers | None = None

    @property
    def name(self) -> str:
        return self.label or self.kind


def serve_flags(options: SlurmOptions) -> list[str]:
    """The `--serve` flags of an array task (a shared servers job takes those after `--serve`)."""
    serve = ["--serve"]
    if options.cpu:
        serve.append("--cpu")
    if options.vllm_python:
        serve += ["--vllm-python", options.vllm_python]
    if options.ready_timeout_s is not None:
        serve += ["--ready-timeout", f"{options.ready_timeout_s:g}"]
    return serve
