"""`cts golden build|merge`: golden construction, once per dataset."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

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
    run_keyed,
    shard_of,
)
from eval.config import load_experiment
from eval.golden import GoldenReport
from eval.run import GOLDEN_ROLES, build_golden, finish_golden, require_roles
from eval.run_dir import RunDir
from eval.runner import MergeReport
from serving.serve import ServeOptions
from serving.yaml_config import Override

app = typer.Typer(
    help="Golden construction (once per dataset): WebDancer on each fused query, its trace "
    "archived, weighted nuggets extracted from it that cite only evidence the trace showed.",
    no_args_is_help=True,
)


@command(app, "build")
def build(
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    output_dir: Path | None = typer.Option(
        None, help="Where records, traces and dataset.jsonl go (default runs/<name>-golden)."
    ),
    limit: int | None = typer.Option(None, help="Only the first N instances of the dataset."),
    shard: str | None = SHARD_OPTION,
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="Search again for instances that got no nuggets."
    ),
    endpoints: Path | None = ENDPOINTS_OPTION,
    serve: bool = SERVE_OPTION,
    gpus: str | None = GPUS_OPTION,
    cpu: bool = CPU_OPTION,
    vllm_python: str | None = VLLM_PYTHON_OPTION,
) -> None:
    """Build golden nuggets for the experiment's dataset (its config needs roles.nugget_builder).

    For each instance: the searcher (WebDancer) on the fused query with golden.seed (default
    1000; never an evaluation seed, so that the oracle condition is an independent run), its
    trace kept under traces/golden/, then the nugget_builder role lists weighted
    nuggets (3 essential, 2 important, 1 context) whose source_ids can only be evidence ids
    that trace showed (corpus doc ids, or URLs with web search). Resumes like `cts run`; a
    sharded build is finished by `cts golden merge`. The result, OUTPUT_DIR/dataset.jsonl, is
    the dataset with `golden` filled in: point an experiment's dataset.path at it."""
    limited = [Override(("dataset", "limit"), limit, "--limit")] if limit is not None else []
    overrides: list[str | Override] = [*set_, *limited]
    part = shard_of(shard)
    resolved = load_experiment(config, overrides)
    require_roles(resolved, GOLDEN_ROLES)  # before any server is started for the build
    run = RunDir(output_dir_option(output_dir) or resolved.golden_dir())
    console = Console()
    console.print(
        f"golden construction for [bold]{resolved.experiment.name}[/bold] → {run.root}",
        highlight=False,
    )
    run_keyed(
        resolved,
        run,
        part,
        ServeOptions(endpoints, serve, gpus, cpu, vllm_python),
        lambda ready, part, watch: build_golden(
            ready, run.root, part, watch=watch, retry_failed=retry_failed
        ),
        console,
        merge_with=f"cts golden merge {run.root}",
        noun="instances searched",
    )
    if part.count > 1:
        return
    _finish(run.root, console)


@command(app, "merge")
def merge(run_dir: Path = typer.Argument(..., help="The golden construction directory.")) -> None:
    """Check every instance has its golden record (across shards), then write dataset.jsonl
    and golden_summary.json. Exit 1 when records are missing or some instance got no nuggets
    (those are listed with why; the others are written)."""
    _finish(run_dir, Console())


def _finish(run_dir: Path, console: Console) -> None:
    merged, report = finish_golden(run_dir)
    if report is None:
        _gaps(merged, run_dir)
        raise typer.Exit(1)
    console.print(_summary_table(report))
    for instance_id, why in list(report.failed.items())[:20]:
        console.print(f"no nuggets for {instance_id}: {why}", highlight=False)
    console.print(
        f"dataset with golden nuggets: {report.dataset}\nuse it in an experiment:\n"
        f"  dataset: {{path: {report.dataset}}}",
        highlight=False,
    )
    if report.failed:
        typer.echo(
            f"{len(report.failed)} instance(s) got no nuggets and are left out of the dataset; "
            "`cts golden build --retry-failed` (same options) tries them again",
            err=True,
        )
        raise typer.Exit(1)


def _gaps(merged: MergeReport, run_dir: Path) -> None:
    for key in merged.missing[:20]:
        typer.echo(f"missing: {key[0]}")
    for key in merged.duplicates[:20]:
        typer.echo(f"duplicate: {key[0]}")
    typer.echo(
        f"{len(merged.missing)} missing, {len(merged.duplicates)} duplicated instances in "
        f"{run_dir}",
        err=True,
    )


def _summary_table(report: GoldenReport) -> Table:
    table = Table("instances with nuggets", "without", "nuggets", "per instance", "weights 3/2/1")
    per = report.nuggets / report.built if report.built else 0.0
    weights = "/".join(str(report.weights.get(w, 0)) for w in (3, 2, 1))
    table.add_row(
        str(report.built), str(len(report.failed)), str(report.nuggets), f"{per:.1f}", weights
    )
    return table
