"""`cts run`, `cts merge`, `cts search` and `cts config show`: an experiment's evaluation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer
from rich.console import Console

from cts.common import (
    CONFIG_OPTION,
    CPU_OPTION,
    ENDPOINTS_OPTION,
    GPUS_OPTION,
    SERVE_OPTION,
    SET_OPTION,
    SHARD_OPTION,
    VLLM_PYTHON_OPTION,
    command,
    output_dir_option,
    print_summary,
    run_keyed,
    shard_of,
)
from eval.config import load_experiment
from eval.engines import open_engines
from eval.run import merge_run, require_roles, run_experiment
from eval.run_dir import RunDir
from eval.search_agent import open_agent
from serving.serve import ServeOptions
from serving.yaml_config import Override
from webdancer.agent import AgentResult

app = typer.Typer()
config_app = typer.Typer(help="Inspect experiment configs.", no_args_is_help=True)


@command(config_app, "show")
def config_show(config: str | None = CONFIG_OPTION, set_: list[str] = SET_OPTION) -> None:
    """Print the resolved config: the experiment with every role's model config filled in."""
    print(load_experiment(config, set_).to_yaml(), end="")


@command(app, "run")
def run(
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    output_dir: Path | None = typer.Option(None, help="Run directory (default from config)."),
    limit: int | None = typer.Option(None, help="Only the first N instances of the dataset."),
    shard: str | None = SHARD_OPTION,
    endpoints: Path | None = ENDPOINTS_OPTION,
    serve: bool = SERVE_OPTION,
    gpus: str | None = GPUS_OPTION,
    cpu: bool = CPU_OPTION,
    vllm_python: str | None = VLLM_PYTHON_OPTION,
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="Run again the keys whose record is a failure."
    ),
) -> None:
    """Run an experiment (default: configs/experiments/quickstart.yaml).

    Every condition (blurred, clarify@1..3, oracle) for every instance and seed: clarify, answer,
    rewrite, search with WebDancer, judge, score. Records, traces, summary.json, report.md,
    report.html and figures go to the run directory. A run resumes where it stopped; Ctrl-C or
    SIGTERM leaves it resumable; a failed key (its error is recorded) is done unless
    --retry-failed. With --serve (what the Slurm jobs use) the models whose engine
    is `openai` are served by vLLM for the run; if a server dies the run stops (exit 1) with
    its finished records kept."""
    limited = [Override(("dataset", "limit"), limit, "--limit")] if limit is not None else []
    overrides: list[str | Override] = [*set_, *limited]
    resolved = load_experiment(config, overrides)
    require_roles(resolved)  # before any server is started for the run
    part = shard_of(shard)
    run_dir = RunDir(output_dir_option(output_dir) or resolved.output_dir())
    console = Console()
    console.print(
        f"experiment [bold]{resolved.experiment.name}[/bold] from {resolved.path} → {run_dir.root}",
        highlight=False,
    )
    result = run_keyed(
        resolved,
        run_dir,
        part,
        ServeOptions(endpoints, serve, gpus, cpu, vllm_python),
        lambda ready, part, watch: run_experiment(
            ready, run_dir.root, part, watch=watch, retry_failed=retry_failed
        ),
        console,
        merge_with=f"cts merge {run_dir.root}",
    )
    if result.report is None:  # a shard: `cts merge` writes the report
        return
    print_summary(console, result.report["summary"])
    console.print(f"report: {result.report['html']} (and report.md, summary.json, figures/)")


@command(app, "merge")
def merge(run_dir: Path = typer.Argument(..., help="The run directory.")) -> None:
    """Check a sharded run is complete, then write its summary and report.

    Every (instance, condition, seed) of the run's config must be recorded exactly once across
    the shard files; missing and duplicated keys are listed and the exit code is 1."""
    report = merge_run(run_dir)
    if not report.ok:
        for key in report.missing[:20]:
            typer.echo(f"missing: {key}")
        for key in report.duplicates[:20]:
            typer.echo(f"duplicate: {key}")
        typer.echo(
            f"{len(report.missing)} missing, {len(report.duplicates)} duplicated keys in {run_dir}",
            err=True,
        )
        raise typer.Exit(1)
    files = RunDir(run_dir)
    print_summary(Console(), files.summary)
    typer.echo(f"merged {len(report.records)} records; report: {files.report_html}")


@command(app, "search")
def search(
    question: str = typer.Argument(..., help="The question to search for."),
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    tools_offline: bool = typer.Option(
        False, "--tools-offline", help="Replay tool calls from the tool cache; a miss is an error."
    ),
    trace: Path | None = typer.Option(None, help="Write the full trace (JSON) to this file."),
) -> None:
    """Run the WebDancer agent on one question with the configured searcher and tools.

    Prints the answer, why the run ended, and the documents the tools showed the model."""
    offline = [Override(("search", "offline"), True, "--tools-offline")] if tools_offline else []
    resolved = load_experiment(config, [*set_, *offline])

    async def go() -> AgentResult:
        async with (
            open_engines(resolved, ["searcher", "summarizer"]) as engines,
            open_agent(resolved, engines) as agent,
        ):
            return await agent.run(question)

    result = asyncio.run(go())
    if trace:
        trace.write_text(json.dumps(result.as_dict(), indent=2, ensure_ascii=False))
    console = Console()
    console.print(f"[bold]answer[/bold]: {result.answer or '(none)'}", highlight=False)
    tools_used = [s["tool"] for s in result.steps if s["kind"] == "tool"]
    console.print(
        f"ended by {result.termination} after {result.llm_calls} model calls "
        f"({result.prompt_tokens} prompt + {result.completion_tokens} completion tokens) and "
        f"{len(tools_used)} tool calls ({', '.join(tools_used) or 'none'}) in "
        f"{result.seconds:.1f} s",
        highlight=False,
    )
    if result.error:
        console.print(f"[red]error[/red]: {result.error}", highlight=False)
    console.print(f"documents seen: {', '.join(result.doc_ids) or 'none'}", highlight=False)
    if trace:
        console.print(f"trace: {trace}")
    if result.termination == "error":
        raise typer.Exit(1)
