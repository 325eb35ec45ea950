"""`cts slurm submit`: an array job (each task serves its models on its GPUs and runs shard
$SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT) and a final job that starts only when every
task succeeded (`afterok`). Four kinds: evaluation (`cts run`, then `cts merge`), golden
construction (`cts golden build`, then `cts golden merge`), re-judging a finished run (`cts
rejudge`, then `cts merge`) and clarifier fine-tuning (`cts train sample`, then pairs and fit
on GPUs).

Safety: sbatch options go to `sbatch` as separate arguments (never through a shell), and every
value inside a rendered script is shell-quoted, so a partition, path or override containing
quotes, `$()`, `;` or spaces runs nothing unintended. The experiment is frozen into the run
directory at submit time, so every shard (and a requeued one) runs the same config.

Preemption: jobs are submitted with `--requeue`; a sharded command finishes on SIGTERM with
every completed record on disk, and a restarted task resumes its shard.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import yaml

from cts.eval.construct.fuse import parts_dir
from cts.eval.construct.store import BUILD_STEPS
from cts.eval.rejudge import rejudge_experiment
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.eval.run.run_dir import RunDir, frozen_experiment
from cts.serving.disk import write_whole
from cts.serving.serve import DEFAULT_READY_TIMEOUT_S, served_models
from cts.slurm.history import latest_chain, record_submission, submissions
from cts.train.config import TrainConfig, load_train_config
from cts.train.loop import LoopStep, iterations, loop_steps
from cts.train.sample import sampling_experiment

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


class SubmitError(RuntimeError):
    """sbatch refused a job; the message has its stderr."""


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


def render(name: str, **values: str) -> str:
    """Fill the `@@key@@` slots of templates/<name> (plain bash otherwise, so `$VAR` stays as
    written). Values must already be shell-quoted."""
    text = resources.files("cts.slurm").joinpath("templates", name).read_text("utf-8")
    slots = set(re.findall(r"@@(\w+)@@", text))
    if slots != set(values):
        raise ValueError(f"template {name} has slots {sorted(slots)}, got {sorted(values)}")
    return re.sub(r"@@(\w+)@@", lambda m: values[m.group(1)], text)


def cts_command() -> list[str]:
    """How a job runs `cts`: this interpreter, so the job uses the same environment."""
    return [sys.executable, "-m", "cts"]


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
    serve += _serve_args(options)[1:]
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


def _serve_args(options: SlurmOptions) -> list[str]:
    serve = ["--serve"]
    if options.cpu:
        serve.append("--cpu")
    if options.vllm_python:
        serve += ["--vllm-python", options.vllm_python]
    if options.ready_timeout_s is not None:
        serve += ["--ready-timeout", f"{options.ready_timeout_s:g}"]
    return serve


def _frozen_text(resolved: ResolvedExperiment, output_dir: Path) -> str:
    """What RunDir.freeze writes, without writing into the run directory."""
    return _yaml_text(frozen_experiment(resolved, output_dir))


def _yaml_text(document: dict[str, Any]) -> str:
    """What RunDir.write_slurm_file writes."""
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True)


def _experiment_job(
    kind: Literal["eval", "golden", "rejudge"],
    resolved: ResolvedExperiment,
    run_dir: Path,
    options: SlurmOptions,
    command: list[str],
    final: list[str],
    titles: tuple[str, str],
    keys_per_instance: int,
    slurm_dir: Path | None,
) -> Job:
    slurm_dir = slurm_dir or RunDir(run_dir).slurm
    frozen = slurm_dir / "experiment.yaml"
    where = ["--config", str(frozen), "--output-dir", str(run_dir)]
    shared = shared_servers(resolved, run_dir, frozen, options)
    if shared is not None:
        ready = options.ready_timeout_s or DEFAULT_READY_TIMEOUT_S
        wait = f"{ready + SHARED_WAIT_MARGIN_S:g}"
        where += ["--endpoints", str(shared.endpoints), "--endpoints-wait", wait]
    return Job(
        kind=kind,
        run_dir=run_dir,
        shared=shared,
        array_title=titles[0],
        final_title=titles[1],
        array_args=[*command, *where, *_serve_args(options)],
        final_args=[[*final, str(run_dir)]],
        final_template="merge.sbatch",
        records_dir=run_dir,
        experiment_file=frozen,
        keys_per_instance=keys_per_instance,
        slurm_dir=slurm_dir,
        frozen={frozen.name: _frozen_text(resolved, run_dir)},
        relocate=lambda d: _experiment_job(
            kind, resolved, run_dir, options, command, final, titles, keys_per_instance, d
        ),
    )


def eval_job(
    resolved: ResolvedExperiment,
    run_dir: Path,
    options: SlurmOptions,
    slurm_dir: Path | None = None,
) -> Job:
    """Evaluation: `cts run` per shard, then `cts merge` (summary, report)."""
    keys = len(resolved.experiment.conditions) * len(resolved.experiment.seeds)
    titles = ("evaluation", "merge")
    return _experiment_job(
        "eval", resolved, run_dir, options, ["run"], ["merge"], titles, keys, slurm_dir
    )


def golden_job(
    resolved: ResolvedExperiment,
    run_dir: Path,
    options: SlurmOptions,
    slurm_dir: Path | None = None,
) -> Job:
    """Golden construction: `cts golden build` per shard, then `cts golden merge` (writes
    RUN_DIR/dataset.jsonl). One record per instance."""
    titles = ("golden construction", "golden merge")
    command, final = ["golden", "build"], ["golden", "merge"]
    return _experiment_job(
        "golden", resolved, run_dir, options, command, final, titles, 1, slurm_dir
    )


def rejudge_job(
    resolved: ResolvedExperiment,
    source: Path,
    run_dir: Path,
    options: SlurmOptions,
    slurm_dir: Path | None = None,
) -> Job:
    """Re-judging: `cts rejudge SOURCE` per shard (only the judge's model is served), then
    `cts merge` (summary, report). `resolved` is the rejudge's experiment
    (cts.eval.rejudge.rejudge_experiment), frozen like an evaluation's."""
    keys = len(resolved.experiment.conditions) * len(resolved.experiment.seeds)
    titles = ("rejudge", "merge")
    command = ["rejudge", str(source)]
    return _experiment_job(
        "rejudge", resolved, run_dir, options, command, ["merge"], titles, keys, slurm_dir
    )


#: What a building job (`cts data fuse|blur`, with the arguments given after `--`) sets itself.
_SET_BY_SUBMIT = ("--shard", "--config", "-c", "--set", "--serve", "--endpoints")


def _build_out(kind: str, args: Sequence[str]) -> Path:
    """The `--out` of a `cts data fuse|blur` argument list; SlurmOptionError without one, or
    with an option the job sets itself."""
    taken = [a for a in args if a.split("=", 1)[0] in _SET_BY_SUBMIT]
    if taken:
        raise SlurmOptionError(
            f"--job {kind}: {', '.join(taken)} after -- : the job sets it (give --config and "
            "--set to cts slurm submit)"
        )
    for i, arg in enumerate(args):
        if arg.startswith("--out="):
            return Path(arg.split("=", 1)[1]).resolve()
        if arg == "--out" and i + 1 < len(args):
            return Path(args[i + 1]).resolve()
    raise SlurmOptionError(
        f"--job {kind}: give the command's arguments after --, e.g. -- FILE --out OUT"
    )


def build_job(
    kind: Literal["fuse", "blur"],
    resolved: ResolvedExperiment,
    args: Sequence[str],
    options: SlurmOptions,
    slurm_dir: Path | None = None,
) -> Job:
    """`cts data fuse|blur ARGS` per shard (rows into OUT.parts/), then the same command
    unsharded: nothing is left to run, so it serves nothing and writes OUT (and, for blur, the
    rejects and the summary)."""
    run_dir = parts_dir(_build_out(kind, args))
    slurm_dir = slurm_dir or RunDir(run_dir).slurm
    frozen = slurm_dir / "experiment.yaml"
    command = ["data", kind, *args, "--config", str(frozen)]
    return Job(
        kind=kind,
        run_dir=run_dir,
        array_title=f"{kind} rows",
        final_title=f"{kind} output",
        array_args=[*command, *_serve_args(options)],
        final_args=[command],
        final_template="merge.sbatch",
        records_dir=run_dir,
        experiment_file=frozen,
        keys_per_instance=1,
        slurm_dir=slurm_dir,
        frozen={frozen.name: _frozen_text(resolved, run_dir)},
        relocate=lambda d: build_job(kind, resolved, args, options, d),
    )


def _freeze_train(
    train: TrainConfig, run_dir: Path, slurm_dir: Path
) -> tuple[TrainConfig, dict[str, str], ResolvedExperiment]:
    """The train config as the jobs read it (its experiment frozen with the models inlined
    beside it, its output dir `run_dir`), the frozen files' texts (experiment.yaml,
    train.yaml) and its sampling experiment."""
    base = load_experiment(train.experiment)
    experiment_file = slurm_dir / "experiment.yaml"
    frozen = train.model_copy(
        # A literal template: `{` and `}` in the path format to themselves.
        update={
            "experiment": str(experiment_file),
            "output_dir": str(run_dir).replace("{", "{{").replace("}", "}}"),
        }
    )
    with tempfile.TemporaryDirectory(prefix="cts-slurm-freeze-") as scratch:
        # The derived experiments load the frozen one from disk: a scratch copy.
        scratch_experiment = RunDir(Path(scratch)).freeze(base, base.output_dir())
        texts = {experiment_file.name: scratch_experiment.read_text()}
        sampling = sampling_experiment(
            frozen.model_copy(update={"experiment": str(scratch_experiment)})
        )
    texts["train.yaml"] = _yaml_text(frozen.model_dump(mode="json"))
    return frozen, texts, sampling


def train_job(
    config: str | None,
    overrides: list[str],
    output_dir: Path | None,
    options: SlurmOptions,
    slurm_dir: Path | None = None,
) -> tuple[Job, str]:
    """Clarifier fine-tuning: `cts train sample` per shard; then, on `fit_gpus` GPUs, `cts
    merge` of the samples (their report), `cts train pairs` and `cts train fit`. The train
    config is frozen with its experiment (models inlined) beside it."""
    train = load_train_config(config, overrides)
    run_dir = (output_dir or train.resolved_output_dir()).resolve()
    slurm_dir = slurm_dir or RunDir(run_dir).slurm
    frozen, texts, sampling = _freeze_train(train, run_dir, slurm_dir)
    samples_file = slurm_dir / "samples_experiment.yaml"
    # What the samples cover (the derived clarify@k experiment), for `cts slurm status`.
    texts[samples_file.name] = _frozen_text(sampling, frozen.samples_dir())
    config_args = ["--config", str(slurm_dir / "train.yaml")]
    job = Job(
        kind="train",
        run_dir=run_dir,
        array_title="sampling",
        final_title="fine-tuning",
        array_args=["train", "sample", *config_args, *_serve_args(options)],
        final_args=[
            ["merge", str(frozen.samples_dir())],
            ["train", "pairs", *config_args],
            ["train", "fit", *config_args],
        ],
        final_template="train.sbatch",
        records_dir=frozen.samples_dir(),
        experiment_file=samples_file,
        keys_per_instance=len(sampling.experiment.conditions) * len(sampling.experiment.seeds),
        slurm_dir=slurm_dir,
        frozen=texts,
        relocate=lambda d: train_job(config, overrides, run_dir, options, d)[0],
    )
    return job, train.name


def train_loop_jobs(
    config: str | None,
    overrides: list[str],
    output_dir: Path | None,
    options: SlurmOptions,
    count: int | None = None,
    slurm_dir: Path | None = None,
) -> tuple[list[Job], str]:
    """`cts train loop` as a chain, each job starting when the one before it succeeded: the
    base clarifier's evaluation (array) and its table; then per iteration i the sampling
    (array) and the fit (`fit_gpus` GPUs), the evaluation (array) and the table so far. Every
    step is `cts train loop-step`, on the frozen train config."""
    train = load_train_config(config, overrides)
    count = count or train.loop.iterations
    run_dir = (output_dir or train.resolved_output_dir()).resolve()
    slurm_dir = slurm_dir or RunDir(run_dir).slurm
    frozen, texts, _ = _freeze_train(train, run_dir, slurm_dir)
    where = ["--config", str(slurm_dir / "train.yaml"), "--iterations", str(count)]

    def args(step: LoopStep) -> list[str]:
        i = str(step.iteration.index)
        return ["train", "loop-step", step.name, "--iteration", i, *where]

    def job(array: LoopStep, final: LoopStep) -> Job:
        place = len(jobs)  # in the chain: a dry run's relocated copy is the same step
        i = array.iteration.index
        evaluates = array.name == "eval"
        what = ("evaluation", "table") if evaluates else ("sampling", "fit")
        return Job(
            kind="train-loop",
            label=f"loop-{array.name}-{i}",
            run_dir=run_dir,
            array_title=f"iteration {i} {what[0]}",
            final_title=f"iteration {i} {what[1]}",
            array_args=[*args(array), *_serve_args(options)],
            final_args=[args(final)],
            final_template="merge.sbatch" if evaluates else "train.sbatch",
            records_dir=array.records_dir(),
            experiment_file=RunDir(array.records_dir()).config,
            keys_per_instance=0,
            keys_known=False,
            slurm_dir=slurm_dir,
            frozen=texts,
            relocate=lambda d: train_loop_jobs(config, overrides, run_dir, options, count, d)[0][
                place
            ],
        )

    # The loop's steps in pairs: a sharded run (array) and the step that finishes it (final).
    steps = loop_steps(iterations(frozen, count))
    jobs: list[Job] = []
    for array, final in zip(steps[::2], steps[1::2], strict=True):
        assert array.sharded and not final.sharded, (array, final)
        jobs.append(job(array, final))
    return jobs, train.name


KINDS = ("eval", "golden", "rejudge", "train", "train-loop", *BUILD_STEPS)


def plan_job(
    kind: str,
    config: str | None,
    overrides: list[str],
    output_dir: Path | None,
    options: SlurmOptions,
    source: Path | None = None,
    iterations: int | None = None,
    build_args: Sequence[str] = (),
) -> tuple[list[Job], str]:
    """The jobs to submit (one, or a train loop's chain) and their name;
    SlurmOptionError/ConfigError for a bad kind or config. `source` is the run a `rejudge` job
    judges again (its --output-dir is required); `iterations` a train loop's count;
    `build_args` a fuse or blur job's command arguments."""
    if kind not in KINDS:
        raise SlurmOptionError(f"--job {kind!r}: expected {', '.join(KINDS)}")
    if options.shared_servers and kind not in ("eval", "golden", "rejudge"):
        raise SlurmOptionError(
            f"--shared-servers: for --job eval, golden or rejudge (a {kind} job's models are "
            "served by its own tasks)"
        )
    if bool(build_args) != (kind in BUILD_STEPS):
        raise SlurmOptionError(
            "arguments after -- are a --job fuse or blur command's own (e.g. -- FILE --out OUT)"
        )
    if kind == "fuse" or kind == "blur":
        kind = cast(Literal["fuse", "blur"], kind)
        if output_dir is not None:
            raise SlurmOptionError(f"--job {kind}: its output is the --out after --")
        resolved = load_experiment(config or "build", overrides)
        return [build_job(kind, resolved, build_args, options)], resolved.experiment.name
    if (source is not None) != (kind == "rejudge"):
        raise SlurmOptionError(
            "--source names the run a rejudge job judges again: give it with --job rejudge only"
        )
    if (iterations is not None) and kind != "train-loop":
        raise SlurmOptionError("--iterations is for --job train-loop only")
    if kind == "train-loop":
        return train_loop_jobs(config, overrides, output_dir, options, iterations)
    if kind == "train":
        job, name = train_job(config, overrides, output_dir, options)
        return [job], name
    if source is not None:
        if output_dir is None:
            raise SlurmOptionError("--job rejudge needs --output-dir (a new run directory)")
        run_dir = output_dir.resolve()
        source = source.resolve()
        resolved = rejudge_experiment(source, run_dir, config, overrides)
        return [rejudge_job(resolved, source, run_dir, options)], resolved.experiment.name
    resolved = load_experiment(config, overrides)
    if kind == "golden":
        run_dir = (output_dir or resolved.golden_dir()).resolve()
        return [golden_job(resolved, run_dir, options)], resolved.experiment.name
    run_dir = (output_dir or resolved.output_dir()).resolve()
    return [eval_job(resolved, run_dir, options)], resolved.experiment.name


def render_array(job: Job, workdir: Path) -> str:
    return render(
        "array.sbatch",
        workdir=shlex.quote(str(workdir)),
        title=shlex.quote(job.array_title),
        array_command=shlex.join([*cts_command(), *job.array_args]),
    )


def render_final(job: Job, workdir: Path) -> str:
    lines = [shlex.join([*cts_command(), *args]) for args in job.final_args]
    # exec: the last command itself receives Slurm's signals.
    lines[-1] = f"exec {lines[-1]}"
    return render(job.final_template, workdir=shlex.quote(str(workdir)), commands="\n".join(lines))


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


def _write(path: Path, text: str) -> None:
    """Replace the file whole: a task starting now reads the old or the new, never half."""
    write_whole(path, text)


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
    logs = RunDir(job.run_dir).slurm_logs  # where the real jobs log (not created by a dry run)
    job.slurm_dir.mkdir(parents=True, exist_ok=True)
    for file_name, text in job.frozen.items():
        _write(job.slurm_dir / file_name, text)
    array_script = job.slurm_dir / f"{job.name}_array.sbatch"
    final_script = job.slurm_dir / f"{job.name}_final.sbatch"
    _write(array_script, render_array(job, workdir))
    _write(final_script, render_final(job, workdir))
    array_args = [
        *options.array_args(),
        f"--job-name=cts-{job.name}-{name}",
        f"--output={logs}/{job.name}-%A_%a.out",
        f"--chdir={workdir}",
    ]
    if follows:
        array_args.append(f"--dependency=afterok:{after or '<previous final job>'}")
    servers = _servers_submission(job, name, options, workdir) if job.shared else None
    if servers is not None:
        # The array's tasks start once the servers job has (then they wait for its endpoints).
        array_args.append(f"--dependency=after:{'<servers job>' if dry_run else servers.start()}")
    final_args = [
        *options.final_args(job.final_template == "train.sbatch"),
        f"--job-name=cts-{job.name}-{name}-final",
        f"--output={logs}/{job.name}-final-%j.out",
        f"--chdir={workdir}",
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
    if dry_run:
        return submission
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
    return submission


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
        _write(script, render("stop.sbatch", server_job=shlex.quote(self.job_id)))
        args = [*self.stop_args, f"--dependency=afterany:{array_job}"]
        self.commands["stop"] = ["sbatch", *args, str(script)]
        return sbatch(args, script)


def _servers_submission(
    job: Job, name: str, options: SlurmOptions, workdir: Path
) -> _ServersSubmission:
    assert job.shared is not None
    logs = RunDir(job.run_dir).slurm_logs
    servers_script = job.slurm_dir / f"{job.name}_servers.sbatch"
    stop_script = job.slurm_dir / f"{job.name}_stop.sbatch"
    command = shlex.join([*cts_command(), *job.shared.serve_args])
    _write(
        servers_script,
        render("servers.sbatch", workdir=shlex.quote(str(workdir)), serve_command=command),
    )
    _write(stop_script, render("stop.sbatch", server_job="'<servers job>'"))
    args = [
        *options.servers_args(),
        f"--job-name=cts-{job.name}-{name}-servers",
        f"--output={logs}/{job.name}-servers-%j.out",
        f"--chdir={workdir}",
    ]
    stop = [
        *options.stop_args(),
        f"--job-name=cts-{job.name}-{name}-stop-servers",
        f"--output={logs}/{job.name}-stop-servers-%j.out",
        f"--chdir={workdir}",
    ]
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
