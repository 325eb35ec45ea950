"""`cts view`: browse run directories' records, dialogues, traces and labels in a browser."""

from __future__ import annotations

from pathlib import Path

import typer

from cts.cli.common import command, usage_error
from cts.eval.viewer.errors import ViewError
from cts.eval.viewer.listen import DEFAULT_PORT, bind, every_interface, is_loopback, serve, url_of
from cts.eval.viewer.view import Viewer

app = typer.Typer()


@command(app, "view")
def view_command(
    run_dirs: list[Path] = typer.Argument(..., help="Run directories to browse (read only)."),
    port: int = typer.Option(DEFAULT_PORT, help="Port to listen on (0: any free one)."),
    host: str = typer.Option(
        "127.0.0.1",
        help="Address to listen on. Anything but loopback lets whoever reaches this machine "
        "read the runs.",
    ),
) -> None:
    """Browse run directories' records, dialogues, traces and labels in a browser.

    Serves, on 127.0.0.1, an index of every record (filters, sorting, pages), each sample's
    clarification dialogue, rewrite, search trace, answer and judged nuggets, and two samples
    side by side (two runs, or two conditions). Records are read once, at start; traces when
    a sample is opened. Nothing is written into the run directories. Stop with Ctrl-C."""
    if not 0 <= port <= 65535:
        raise usage_error(f"--port {port}: expected 0–65535")
    viewer = Viewer(run_dirs)  # a path without config.yaml: RunDirError, exit 2
    try:
        sock = bind(host, port)
    except ViewError as e:
        raise usage_error(str(e)) from None
    for run in viewer.runs:
        if run.config_error:
            typer.echo(
                f"warning: {run.root}: {run.config_error}\n(its records are shown "
                "without the dataset's queries and nuggets)",
                err=True,
            )
    bound = sock.getsockname()[0]
    if every_interface(bound):
        typer.echo(
            f"warning: serving on {host} ({bound}: every interface): anyone who can reach this "
            "machine can read these runs"
        )
    elif not is_loopback(bound):
        typer.echo(f"warning: serving on {host}: anyone who can reach it can read these runs")
    records = sum(len(r.records) for r in viewer.runs)
    typer.echo(f"{records} records of {len(viewer.runs)} run(s)")
    # The line report.html's readers and scripts look for; flushed before serving blocks.
    typer.echo(f"cts view: {url_of(sock)} (Ctrl-C stops)")
    serve(viewer, sock, host)
