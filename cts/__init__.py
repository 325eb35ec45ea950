"""The `cts` command line: one typer sub-app per package, nothing else."""
