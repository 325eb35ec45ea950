"""The `cts` command: mounts each package's sub-app."""

from __future__ import annotations

import typer

from eval import cli as eval_cli
from eval import golden_cli, serve_cli
from serving import cli as serving_cli
from slurm import cli as slurm_cli
from train import cli as train_cli

app = typer.Typer(
    help="Clarify-Then-Search: does a clarification question, asked before a deep search, "
    "restore what a vague query left out? Runs the benchmark on local models.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
serving_cli.app.command("check")(eval_cli.models_check)
app.add_typer(serving_cli.app, name="models")
app.add_typer(eval_cli.config_app, name="config")
app.add_typer(eval_cli.data_app, name="data")
app.add_typer(golden_cli.app, name="golden")
app.add_typer(slurm_cli.app, name="slurm")
app.add_typer(train_cli.app, name="train")
app.command("run")(eval_cli.run)
app.command("serve")(serve_cli.serve)
app.command("search")(eval_cli.search)
app.command("merge")(eval_cli.merge_command)
app.command("report")(eval_cli.report_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
