"""`cts serve`: the experiment's models behind vLLM servers, in the foreground until stopped."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from cts.cli.common import command, output_console
from cts.cli.options import (
    CONFIG_OPTION,
    CPU_HELP,
    GPUS_HELP,
    PYTHON_HELP,
    SET_OPTION,
    checked_output_dir,
    output_dir_option,
)
from cts.eval.run.config import load_experiment
from cts.eval.run.run_dir import RunDir
from cts.serving.server_group import ServeOptions, ServerGroup, Stopped, serving, stop_on_signals
from cts.serving.server_plan import dry_run_text, only_models

app = typer.Typer()


@command(app, "serve")
def serve(
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    output_dir: Path | None = output_dir_option(
        "Run directory: logs go to logs/serve/ under it (default from config)."
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
    models: str | None = typer.Option(
        None,
        "--models",
        help="Serve only these model keys, comma-separated (a shared servers job's: `cts slurm "
        "submit --shared-servers`).",
    ),
    adapters: list[str] = typer.Option(
        [],
        "--adapters",
        help="A LoRA adapter's model config (name or YAML path, with lora_of naming a model "
        "here) to load beside its base too; repeat it: one server for several clarifiers' runs.",
    ),
) -> None:
    """Serve the experiment's models with vLLM until Ctrl-C or SIGTERM.

    One server per distinct model whose engine is `openai` (and `vllm.serve` is on), on GPUs from
    its `vllm.gpus` or packed from its tensor_parallel_size and gpu_memory_utilization. Ready
    means GET /health answers 200 and the process is alive. Then the endpoints file lists each
    model's URL for `cts run --endpoints FILE`. If any server dies, all are stopped and the
    error names the model with the tail of its log (exit 1)."""
    resolved = load_experiment(config, set_).with_adapters(adapters)
    run = RunDir(checked_output_dir(output_dir) or resolved.output_dir())
    endpoints = endpoints or run.endpoints
    options = ServeOptions(gpus=gpus, cpu=cpu, vllm_python=vllm_python)
    planned = options.plan(only_models(resolved.model_configs, models), run.serve_logs(), host)
    console = output_console()
    if not planned:
        console.print("no model of this experiment is served (no role uses engine: openai)")
        return
    if dry_run:
        print(dry_run_text(planned))
        return
    group = ServerGroup(planned, deadline_s=ready_timeout)
    console.print(f"starting {len(planned)} vLLM server(s); logs in {run.serve_logs()}")
    try:
        with stop_on_signals(), serving(group, endpoints):
            console.print(_ready_table(group))
            console.print(f"endpoints: {endpoints}; Ctrl-C or SIGTERM stops every server")
            reported: set[str] = set()
            while True:
                group.check()
                for label in sorted(group.lost.keys() - reported):
                    console.print(
                        f"[yellow]{label}: server exited with code {group.lost[label]}; its "
                        "model's other copies serve on (the endpoints file still lists it)[/]"
                    )
                    reported.add(label)
                time.sleep(2.0)
    except Stopped as e:  # the way a foreground server is meant to end: not an error
        console.print(f"{e}: all servers stopped")


def _ready_table(group: ServerGroup) -> Table:
    table = Table("model", "served name", "url", "GPUs", "ready after")
    for p in group.planned:
        table.add_row(
            p.label,
            p.config.name,
            p.server.base_url,
            ",".join(p.gpus) or "CPU",
            f"{group.ready_s.get(p.label, 0):.0f} s",
        )
    return table
