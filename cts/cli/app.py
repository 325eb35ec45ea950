"""The `cts` command: every command group, mounted. Only cts/cli/ speaks typer; the packages
beside it raise domain errors and return values (cts/cli/common.py maps the errors to exit
codes)."""

from __future__ import annotations

import typer

from cts.cli import (
    data,
    doctor,
    estimate,
    golden,
    judge,
    models,
    report,
    run,
    serve,
    slurm,
    train,
    view,
)
from cts.cli.answerer import app as answerer_app

app = typer.Typer(
    help="Clarify-Then-Search: does a clarification question, asked before a deep search, "
    "restore what a vague query left out? Runs the benchmark on local models.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
# Top-level commands: run, merge, search, serve, report, view, estimate, doctor.
for group in (run.app, serve.app, report.app, view.app, estimate.app, doctor.app):
    app.add_typer(group)
app.add_typer(models.app, name="models")
app.add_typer(run.config_app, name="config")
app.add_typer(data.app, name="data")
app.add_typer(golden.app, name="golden")
app.add_typer(judge.app, name="judge")
app.add_typer(answerer_app, name="answerer")
app.add_typer(slurm.app, name="slurm")
app.add_typer(train.app, name="train")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
