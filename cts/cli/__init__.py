"""The `cts` command line: one typer sub-app per command group (the only package that speaks
typer), mounted on one app (`cts.cli.app`)."""

from cts.cli.app import app, main

__all__ = ["app", "main"]
