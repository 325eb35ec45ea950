"""What the commands share: `command`, the one mapping from domain errors to messages and exit
codes, and `run_keyed` (resolve → serve → run the keys → account). The options themselves are
declared in `cts.cli.options`."""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cts.cli.options import OptionGroup, expand_groups
from cts.eval.construct.blur import BlurError
from cts.eval.construct.store import BuildFileError, SettingsChanged
from cts.eval.data.readers import DatasetError
from cts.eval.experiment import RunResult, require_roles, run_experiment, serving_for
from cts.eval.report.comparability import IncomparableRuns
from cts.eval.report.markdown import MAIN_COLUMNS, report_cell
from cts.eval.report.summary import Summary, SummaryError, read_summary
from cts.eval.report.warnings import warnings
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.eval.run.config_sections import Role
from cts.eval.run.dialogue import DialogueFileError
from cts.eval.run.locks import ShardBusy
from cts.eval.run.progress import ProgressLog, ShowProgress
from cts.eval.run.records import RecordFileError
from cts.eval.run.run_dir import RunDir, RunDirError, Shard, ShardError
from cts.eval.sweep_power import DetectError
from cts.foundation.disk import NotAFile, StorageFull
from cts.foundation.yaml_config import ConfigError
from cts.serving.download import DownloadError
from cts.serving.engine import EngineStats
from cts.serving.errors import ServerUnreachable
from cts.serving.model_config import model_label
from cts.serving.server_group import EndpointsError, ServeOptions, Stopped, read_endpoints
from cts.serving.server_plan import PlanError
from cts.serving.vllm_server import ServerError
from cts.slurm.chain import SubmitError
from cts.slurm.plan import SlurmOptionError
from cts.train.fit import FitError
from cts.train.loop import LoopError
from cts.train.pairs import PairsError
from cts.webdancer.corpus import CorpusError
from cts.webdancer.tool_cache import ToolCacheMiss

# -- errors -----------------------------------------------------------------------------------

#: Every domain error a command can end with: how its message starts, and the exit code.
#: 2: the input is wrong (fix it, run again); 1: the work failed, and what was finished is kept;
#: 130: a signal stopped it. The first class the error is an instance of decides.
EXITS: list[tuple[type[Exception], str, int]] = [
    (ConfigError, "config error\n", 2),
    (DatasetError, "dataset error\n", 2),
    (CorpusError, "corpus error\n", 2),
    (EndpointsError, "endpoints error: ", 2),
    (PlanError, "GPU plan error: ", 2),
    (ShardError, "", 2),
    (SlurmOptionError, "error: ", 2),
    (RunDirError, "", 2),
    (IncomparableRuns, "", 2),
    (NotAFile, "", 2),
    (BlurError, "blur error: ", 2),
    (DetectError, "detect error: ", 2),
    (RecordFileError, "records error: ", 1),
    (BuildFileError, "build rows error: ", 1),
    (SettingsChanged, "build error: ", 2),
    (SummaryError, "summary error: ", 1),
    (DialogueFileError, "dialogues error: ", 1),
    (PairsError, "pairs error: ", 1),
    (FitError, "fit error: ", 1),
    (LoopError, "loop error: ", 2),
    (SubmitError, "submit failed: ", 1),
    (DownloadError, "download failed: ", 1),
    (ToolCacheMiss, "tool cache miss: ", 1),
    (ServerError, "server error: ", 1),
    (StorageFull, "storage error: ", 1),
    (ShardBusy, "", 1),
    (ServerUnreachable, "server unreachable: ", 1),
    (Stopped, "", 130),
]
_AFTER = {
    ServerError: "\nevery server was stopped (a run keeps its finished records and resumes)",
    Stopped: " while starting the servers: all stopped",
    ServerUnreachable: "\nthe run stopped; its finished records are kept: once the server is "
    "back, run the same command to resume",
}


def exit_for(error: Exception) -> tuple[str, int] | None:
    """The message and exit code of a domain error; None for anything else (a bug: it keeps
    its traceback)."""
    for cls, prefix, code in EXITS:
        if isinstance(error, cls):
            return f"{prefix}{error}{_AFTER.get(cls, '')}", code
    return None


@contextmanager
def exits() -> Iterator[None]:
    try:
        yield
    except Exception as e:
        found = exit_for(e)
        if found is None:
            raise
        typer.echo(found[0], err=True)
        raise typer.Exit(found[1]) from None


F = TypeVar("F", bound=Callable[..., Any])


def flowing(text: str | None) -> str:
    """A docstring as help that flows: each paragraph one line, which the terminal's renderer
    wraps at its own width (the source's hard wrap, kept, made ragged lines). A paragraph
    with indented or bulleted lines (an example, a list) keeps its lines."""
    paragraphs = inspect.cleandoc(text or "").split("\n\n")
    kept = [
        p
        if any(line.startswith((" ", "-", "*", "|")) for line in p.splitlines()[1:])
        else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs
    ]
    return "\n\n".join(kept)


#: The longest line `cts --help` gives a command before cutting its first sentence short.
SHORT_HELP = 80


def first_sentence(text: str | None) -> str:
    """What `cts --help` lists a command or group by, one line: its help's first sentence, cut
    at its first colon, semicolon or dash when it is longer than SHORT_HELP characters."""
    flat = flowing(text).split("\n\n", 1)[0]
    found = re.search(r"^(.+?[.?!])(?=\s+[A-Z(`]|$)", flat)
    sentence = found.group(1) if found else flat
    if len(sentence) > SHORT_HELP:
        cut = re.search(r"^(.{20,}?)(?::| —|;) ", sentence)
        if cut:
            return cut.group(1)
    return sentence


def command_group(help: str) -> typer.Typer:
    """A command group (`cts golden`, `cts train`, ...): alone, it lists its commands; `cts
    --help` lists it by its first sentence."""
    return typer.Typer(help=flowing(help), short_help=first_sentence(help), no_args_is_help=True)


def command(group: typer.Typer, name: str) -> Callable[[F], F]:
    """Register `name` on `group`; a domain error it raises ends it with its message and exit
    code (EXITS), so command bodies hold no try/except of their own. A parameter whose default
    is an `OptionGroup` (`SERVING`, `SBATCH`, ...) stands for its options: the command line has
    them in its place, and the command gets the one value they make."""

    def register(fn: F) -> F:
        signature = inspect.signature(fn)
        grouped = [
            (p.name, p.default)
            for p in signature.parameters.values()
            if isinstance(p.default, OptionGroup)
        ]

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with exits():
                for param, options in grouped:
                    kwargs[param] = options.take(kwargs)
                return fn(*args, **kwargs)

        if grouped:
            expand_groups(wrapped, signature)
        doc = fn.__doc__
        group.command(name, help=flowing(doc), short_help=first_sentence(doc))(wrapped)
        return fn

    return register


def usage_error(message: str) -> typer.Exit:
    """A bad option value the domain cannot see (exit 2)."""
    typer.echo(message, err=True)
    return typer.Exit(2)


# -- calibration against labels ---------------------------------------------------------------


def role_experiment(
    config: str | None, set_: list[str], endpoints: Path | None, role: Role
) -> tuple[ResolvedExperiment, str]:
    """The experiment, which must have `role`, pointed at --endpoints; and the label of the
    role's model."""
    resolved = load_experiment(config, set_)
    require_roles(resolved, [role])
    if endpoints is not None:
        resolved = resolved.with_endpoints(read_endpoints(endpoints))
    return resolved, model_label(
        resolved.experiment.roles[role].model, resolved.model_for(role).name
    )


def write_figures(out: Path | None, role: str, name: str, figures: dict[str, Any]) -> None:
    """With --out: the figures as JSON, under the role's model label."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {role: name, **figures}
    out.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    typer.echo(f"figures: {out}")


# -- running keys -----------------------------------------------------------------------------

#: What `run_keyed` runs: the experiment pointed at its models, the shard, the check that the
#: servers started for it live (None: none was), and how to show the keys' progress.
Work = Callable[[ResolvedExperiment, Shard, Callable[[], None] | None, ShowProgress], RunResult]

#: Wider than any table or line: without a terminal, output is printed at its natural width.
_LOG_WIDTH = 10_000
#: Seconds between two progress lines of a run whose output is not a terminal (default 30).
PROGRESS_EVERY_ENV = "CTS_PROGRESS_EVERY_S"


def output_console() -> Console:
    """The console a command prints on: at a terminal, its width; otherwise (a pipe, a CI log,
    an sbatch output file) nothing is wrapped, where rich would wrap every line at 80 columns."""
    console = Console()
    return console if console.is_terminal else Console(width=_LOG_WIDTH)


def progress_for(console: Console) -> ShowProgress:
    """A progress bar at a terminal; in a log, where a bar is never drawn until the end, a line
    at most every $CTS_PROGRESS_EVERY_S seconds (default 30)."""
    if console.is_terminal:
        return True
    text = os.environ.get(PROGRESS_EVERY_ENV, "30")
    try:
        every_s = float(text)
    except ValueError:
        every_s = math.nan
    if not 0 <= every_s < math.inf:
        raise usage_error(f"${PROGRESS_EVERY_ENV}={text!r}: expected seconds >= 0, e.g. 30")

    def emit(line: str) -> None:
        console.print(line, highlight=False, markup=False, soft_wrap=True)

    return ProgressLog(emit, every_s)


def run_into(
    root: Path, retry_failed: bool = False, notify: Callable[[str], None] = lambda line: None
) -> Work:
    """`run_keyed`'s work for an evaluation run: the experiment run into `root`; `notify`
    shows what the run says before its first model call."""
    return lambda ready, part, watch, progress: run_experiment(
        ready,
        root,
        notify=notify,
        shard=part,
        show_progress=progress,
        watch=watch,
        retry_failed=retry_failed,
    )


def run_keyed(
    resolved: ResolvedExperiment,
    run: RunDir,
    shard: Shard,
    options: ServeOptions,
    work: Work,
    console: Console,
    merge_with: str,
    noun: str = "records written",
    retry: bool = True,
) -> RunResult:
    """The experiment pointed at its models (an endpoints file, or servers started for the
    run), `work` run on it, and its one-line account; a shard says that `merge_with` finishes
    the run. A dead server stops the work (exit 1, finished records kept); an interrupted run
    exits 130 and resumes when rerun. `retry`: the command takes --retry-failed."""

    def starting(n: int) -> None:
        console.print(f"starting {n} vLLM server(s)")

    progress = progress_for(console)
    with serving_for(resolved, options, run.serve_logs(shard), starting) as ready:
        result = work(ready.resolved, shard, ready.watch, progress)
    print_account(console, result, shard, merge_with, noun, retry)
    return result


def _failed_words(failures: Mapping[str, int], retry: bool) -> str:
    """`0 failed`, or `8 failed (engine_error 8; a plain rerun keeps them; …)`."""
    failed = sum(failures.values())
    if not failed:
        return "0 failed"
    kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(failures.items()))
    again = "; --retry-failed runs them again" if retry else ""
    return f"{failed} failed ({kinds}; a plain rerun keeps them{again})"


def _cache_words(counts: Mapping[str, int]) -> str:
    """`21 hits, 36 misses` (and `, 2 invalid` when any row was)."""
    words = f"{counts.get('hits', 0)} hits, {counts.get('misses', 0)} misses"
    invalid = counts.get("invalid", 0)
    return words + (f", {invalid} invalid" if invalid else "")


def print_account(
    console: Console,
    result: RunResult,
    shard: Shard,
    merge_with: str,
    noun: str = "records written",
    retry: bool = True,
) -> None:
    """A run's one-line account and its retry warnings; an interrupted run exits 130 (its
    finished records kept), a shard says that `merge_with` finishes the run. Failed records
    count as done, so a plain rerun keeps them: the line says so, and (`retry`: the command
    takes it) that --retry-failed runs them again."""
    outcome = result.outcome
    console.print(
        f"{outcome.ran} {noun}, {outcome.skipped} already done, "
        f"{_failed_words(outcome.failures, retry)}; {result.model_calls} model calls"
        + (f", response cache {_cache_words(result.cache)}" if result.cache is not None else "")
        + (
            f", tool cache {_cache_words(result.tool_cache)}"
            if result.tool_cache is not None
            else ""
        )
        + f"; {result.seconds:.0f} s",
        highlight=False,
        soft_wrap=True,
    )
    for line in retry_warnings(result.engine_stats):
        console.print(line, style="yellow", highlight=False, markup=False, soft_wrap=True)
    if outcome.interrupted:
        console.print("interrupted: finished records are saved; run the same command to resume")
        raise typer.Exit(130)
    if shard.count > 1:
        console.print(
            f"shard {shard.index}/{shard.count} done; when every shard is done: {merge_with}"
        )


def retry_warnings(stats: dict[str, EngineStats]) -> list[str]:
    """A line per model whose requests were sent again: not a failure, but lost work (a
    timed-out request's tokens on the server) that a user tuning a sweep must see."""
    lines = []
    for name, s in stats.items():
        if s.retried:
            reasons = ", ".join(f"{why} {n}" for why, n in s.retried.most_common())
            advice = (
                "; the server was too slow to answer in time: if it is busy rather than dead, "
                "raise the model's `timeout_s` or lower its `max_concurrency`"
                if "timeout" in s.retried
                else ""
            )
            down = s.replicas.found_down() if s.replicas else ""
            lines.append(
                f"{name}: {s.retried.total()} attempts sent again over {s.calls} requests "
                f"({reasons}){advice}{'; ' + down if down else ''}"
            )
    return lines


# -- the main table ---------------------------------------------------------------------------


def main_table(summary: Summary) -> Table:
    policy = summary.report.failure_policy
    table = Table(
        "system",
        *MAIN_COLUMNS,
        title="restore_score_100 [95% CI] (n instances; f instances with a failed record)",
        caption=f"paired on {summary.report.paired_instances} instances; failures: "
        + ("scored 0" if policy == "zero" else "excluded"),
    )
    for name, system in summary.systems.items():
        # Text, not markup: a name like "quickstart (x) [runs-a]" must print as it is.
        table.add_row(
            Text(name), *(Text(report_cell(system.scores.get(c), policy)) for c in MAIN_COLUMNS)
        )
    return table


def print_summary(console: Console, summary: Summary | Path) -> None:
    """The main table and the warnings a reader must not miss. Without a terminal (a log, a
    pipe) the table is printed whole at its natural width, never wrapped at 80 columns."""
    if not console.is_terminal:
        console = Console(file=console.file, width=_LOG_WIDTH)
    if isinstance(summary, Path):
        summary = read_summary(summary)
    console.print(main_table(summary))
    for name, system in summary.systems.items():
        for line in warnings(name, system.model_dump()):
            console.print(line, style="yellow", highlight=False, markup=False)
