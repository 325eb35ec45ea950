"""`cts report`: runs of several clarifier systems combined into one report."""

from __future__ import annotations

from pathlib import Path

import typer

from cts.cli.common import command, output_console, print_summary, usage_error
from cts.eval.report.report import check_complete, write_report

app = typer.Typer()


@command(app, "report")
def report_command(
    run_dirs: list[Path] = typer.Argument(..., help="One run directory per clarifier system."),
    out: Path = typer.Option(Path("report"), help="Where to write the combined report."),
    failures: str | None = typer.Option(
        None,
        help="exclude: compare on the instances scored under every condition of every run "
        "(paired); zero: a failed record scores 0. Default: the first run's report.failures.",
    ),
    min_gap: float | None = typer.Option(
        None,
        help="Gain recovered only when oracle beats blurred by at least this many points. "
        "Default: the first run's report.min_gap (1.0).",
    ),
    allow_unlike: bool = typer.Option(
        False,
        "--allow-unlike",
        help="Compare runs that differ beyond the clarifier (judge, User Answerer, rewriter, "
        "searcher, summarizer, search, budgets, nuggets, dataset) anyway, with a warning on "
        "every row. Without it such runs are refused, listing what differs.",
    ),
    strict: bool = typer.Option(
        False,
        "--strict",
        help="A run with missing or duplicated keys (as `cts merge` checks) is an error "
        "(exit 1, nothing written) instead of a warning.",
    ),
) -> None:
    """Combine the runs of several clarifier systems into one report.

    The main table has one row per system, paired on the instances every run scored; systems
    are compared pairwise per condition (paired bootstrap CI, sign-flip test, Holm across k);
    then diagnostics and figures. Runs that differ in anything but the clarifier (and its
    sampling) are refused with the list (exit 2; runs that differ by judge: `cts judge
    agreement`), unless --allow-unlike. A run missing keys of its config, or holding one
    twice, is warned about on stderr (an error with --strict)."""
    if failures not in (None, "exclude", "zero"):
        raise usage_error(f"--failures {failures!r}: expected exclude or zero")
    if min_gap is not None and not min_gap > 0:
        raise usage_error(f"--min-gap {min_gap}: must be a positive number of points")
    if out.exists() and not out.is_dir():
        raise usage_error(f"--out {out}: not a directory (an existing file)")
    # A path without config.yaml is refused before anything is written (RunDirError, exit 2).
    # Completeness is checked read-only, before anything is written.
    incomplete = [c for c in map(check_complete, run_dirs) if not c.ok]
    for found in incomplete:
        typer.echo(f"{'error' if strict else 'warning'}: {found.describe()}", err=True)
    if incomplete and strict:
        typer.echo(f"{len(incomplete)} incomplete run(s): nothing written (--strict)", err=True)
        raise typer.Exit(1)
    written = write_report(run_dirs, out, failures, min_gap, allow_unlike)  # type: ignore[arg-type]
    print_summary(output_console(), written.summary)
    typer.echo(f"report: {written.html}")
