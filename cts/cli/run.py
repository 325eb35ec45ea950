"""`cts run`, `cts rejudge`, `cts merge`, `cts search` and `cts config show`: an experiment's
evaluation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console

from cts.cli.common import (
    command,
    command_group,
    output_console,
    print_account,
    print_summary,
    progress_for,
    run_keyed,
)
from cts.cli.judge import moved
from cts.cli.options import (
    CONFIG_OPTION,
    OUTPUT_DIR_OPTION,
    SERVING,
    SET_OPTION,
    SHARD_OPTION,
    checked_output_dir,
    serving,
    shard_of,
)
from cts.eval.audit.agreement import PairAgreement
from cts.eval.experiment import RunResult, merge_run, require_roles, serve_and_run
from cts.eval.plan import ModelPlan, RunPlan, plan_run
from cts.eval.rejudge import judge_served, rejudge_experiment, rejudge_run, with_judge_from
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.eval.run.engines import open_engines
from cts.eval.run.progress import ShowProgress
from cts.eval.run.run_dir import RunDir, Shard
from cts.eval.run.search_agent import open_agent
from cts.foundation.yaml_config import Override
from cts.serving.server_group import ServeOptions
from cts.webdancer.agent import AgentResult

app = typer.Typer()
config_app = command_group("Inspect experiment configs.")


@command(config_app, "show")
def config_show(config: str | None = CONFIG_OPTION, set_: list[str] = SET_OPTION) -> None:
    """Print the resolved config: the experiment with every role's model config filled in.
    A role override the role replaces with its own need is named on stderr, with the value its
    requests use."""
    resolved = load_experiment(config, set_)
    print(resolved.to_yaml(), end="")
    for unused in resolved.unused_sampling():
        typer.echo(f"note: {unused}", err=True)


@command(app, "run")
def run(
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    output_dir: Path | None = OUTPUT_DIR_OPTION,
    limit: int | None = typer.Option(None, help="Only the first N instances of the dataset."),
    shard: str | None = SHARD_OPTION,
    options: ServeOptions = SERVING,
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="Run again the keys whose record is a failure."
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the plan (keys to run and done, where each model runs, search, output "
        "directory, whether it may resume, the notes the run would print) and exit: no model "
        "is loaded or called, nothing is written. Exit 2 when the run would be refused.",
    ),
) -> None:
    """Run an experiment (default: cts/configs/experiments/quickstart.yaml).

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
    run_dir = RunDir(checked_output_dir(output_dir) or resolved.output_dir())
    console = output_console()
    if dry_run:
        plan = plan_run(resolved, run_dir.root, part, options, retry_failed)
        for line in plan_lines(plan):
            console.print(line, highlight=False, markup=False)
        if plan.refusal is not None:
            raise typer.Exit(2)
        return
    console.print(
        f"experiment [bold]{resolved.experiment.name}[/bold] from {resolved.path} → {run_dir.root}",
        highlight=False,
    )

    def note(line: str) -> None:
        console.print(line, style="yellow", highlight=False, markup=False, soft_wrap=True)

    result = serve_and_run(
        resolved,
        run_dir.root,
        serve=options,
        starting=lambda n: console.print(f"starting {n} vLLM server(s)"),
        notify=note,
        shard=part,
        show_progress=progress_for(console),
        retry_failed=retry_failed,
    )
    print_account(console, result, part, f"cts merge {run_dir.root}")
    if result.report is None:  # a shard: `cts merge` writes the report
        return
    print_summary(console, result.report.summary)
    console.print(f"report: {result.report.html} (and report.md, summary.json, figures/)")


def plan_lines(plan: RunPlan) -> list[str]:
    """`cts run --dry-run`'s report of a plan."""
    experiment = plan.resolved.experiment
    run = RunDir(plan.run_dir)
    if plan.resumes:
        state = "resumes the run there" if plan.refusal is None else "holds another run"
    else:
        state = "exists, no run in it yet" if plan.run_dir.exists() else "new"
    dataset = experiment.dataset
    lines = [
        "dry run: no model is loaded or called, nothing is written",
        f"experiment {experiment.name} from {plan.resolved.path}",
        f"output dir: {plan.run_dir} ({state})",
        f"dataset: {dataset.path}"
        + (f" split {dataset.split}" if dataset.split else "")
        + f": {plan.run_instances} of {plan.dataset_instances} instances"
        + (f" (limit {dataset.limit})" if dataset.limit else ""),
        f"shard: {plan.shard.index}/{plan.shard.count}, {plan.shard_instances} instance(s); "
        f"seeds {', '.join(map(str, experiment.seeds))}",
        "keys (instance, condition, seed):",
    ]
    width = max(len(c.condition) for c in plan.conditions)
    for c in plan.conditions:
        kept = f" ({c.failed} of them failed; --retry-failed runs them again)" if c.failed else ""
        lines.append(
            f"  {c.condition:<{width}}  {c.keys} keys: {c.done} done, {c.to_run} to run{kept}"
        )
    lines.append(
        f"  {'all':<{width}}  {plan.keys} keys: {plan.done} done, {plan.keys - plan.done} to run"
        + (" (failed records run again: --retry-failed)" if plan.retry_failed else "")
    )
    lines.append("models:")
    for m in plan.models:
        lines.append(f"  {m.ref} ({m.name}) for {', '.join(m.roles)}: {_where(m)}")
    started = [m.ref for m in plan.models if m.started]
    if started:
        logs = run.serve_logs(plan.shard)
        lines.append(
            f"  --serve starts {len(started)} vLLM server(s), logs under {logs}; "
            "`cts serve --dry-run` prints their commands and GPUs"
        )
    search = experiment.search
    backend = (
        f"local BM25 over corpus {search.corpus}"
        if search.backend == "local"
        else f"{search.backend} at {search.endpoint or 'its default endpoint'}"
    )
    lines.append(
        f"search: {backend}, top {search.top_k}, pages visited from "
        + ("the corpus" if search.visit == "local" else "the web (HTTP)")
        + f"; tool cache {search.tool_cache}"
        + (" (offline: replayed only)" if search.offline else "")
    )
    cache = experiment.cache
    lines.append(f"response cache: {cache.path if cache.enabled else 'off'}")
    if plan.refusal is not None:
        lines.append(f"resume: refused (exit 2) — {plan.refusal}")
    elif plan.resumes:
        lines.append(f"resume: {run.config} matches this config; the run resumes")
    else:
        lines.append(f"resume: nothing to resume; {run.config} would be written")
    return lines + plan.notes


def _where(model: ModelPlan) -> str:
    if model.engine in ("scripted", "lexical"):
        return f"in-process ({model.engine}), no weights"
    if model.engine != "openai":
        return f"in-process ({model.engine}), weights {model.path}"
    if model.started:
        return f"vLLM server started for the run (--serve), weights {model.path}"
    if isinstance(model.endpoint, list):
        where = f"openai, {len(model.endpoint)} replicas: {', '.join(model.endpoint)}"
    else:
        where = f"openai endpoint {model.endpoint}" if model.endpoint else "openai, no endpoint set"
    return where + ("; --serve would start vLLM for it" if model.servable else "")


_REJUDGE_OUTPUT = typer.Option(
    ..., "--output-dir", help="The new run directory (records, summary, report)."
)
_REJUDGE_CONFIG = typer.Option(
    None,
    "--config",
    "-c",
    help="Experiment YAML to judge with (default: the source's config.yaml); it may differ "
    "from the source's only in the judge.",
)
_REJUDGE_SET = typer.Option(
    [],
    "--set",
    help="Override a judge key, e.g. --set roles.judge.model=qwen3-32b, "
    "--set judge.show_query=true (repeatable).",
)
_REJUDGE_SERVING = serving("Start the judge's vLLM server first (no other model), stop it after.")
_REJUDGE_RETRY = typer.Option(
    False, "--retry-failed", help="Judge again the keys whose new record is a failure."
)


@command(app, "rejudge")
def rejudge(
    source: Path = typer.Argument(..., help="The finished run whose answers are judged again."),
    output_dir: Path = _REJUDGE_OUTPUT,
    config: str | None = _REJUDGE_CONFIG,
    set_: list[str] = _REJUDGE_SET,
    shard: str | None = SHARD_OPTION,
    options: ServeOptions = _REJUDGE_SERVING,
    retry_failed: bool = _REJUDGE_RETRY,
) -> None:
    """Score a finished run's stored answers again with another judge, calling no other role.

    The config is the source run's (or --config) with --set overrides, which may change the
    judge only: roles.judge, judge: (show_query, shuffle, batch_size) and the models only the
    judge uses. Records that failed before the judge in the source stay failures (copied with
    their error). The new judge's answers are cached in OUTPUT_DIR/cache/ only, never read
    from a shared cache, so no label of the source run is replayed. Records, summary and
    report go to OUTPUT_DIR (read by `cts report`, `cts merge`, `cts judge agreement`), with
    rejudge.json naming the source run. Sharded and resumable like `cts run`."""
    resolved = rejudge_experiment(
        source, checked_output_dir(output_dir) or output_dir, config, set_
    )
    part = shard_of(shard)
    run_dir = RunDir(output_dir)
    console = output_console()
    console.print(
        f"rejudge [bold]{source}[/bold] with judge "
        f"{resolved.experiment.roles['judge'].model} → {run_dir.root}",
        highlight=False,
    )
    copied = 0
    against: PairAgreement | None = None

    def work(
        ready: ResolvedExperiment,
        part: Shard,
        watch: Callable[[], None] | None,
        progress: ShowProgress,
    ) -> RunResult:
        nonlocal copied, against
        result = rejudge_run(
            with_judge_from(resolved, ready),
            source,
            run_dir.root,
            shard=part,
            show_progress=progress,
            watch=watch,
            retry_failed=retry_failed,
        )
        copied, against = result.copied_failures, result.against_source
        return result

    result = run_keyed(
        judge_served(resolved),
        run_dir,
        part,
        options,
        work,
        console,
        merge_with=f"cts merge {run_dir.root}",
    )
    _print_rejudged(console, result, copied, against, source, run_dir.root)


def _print_rejudged(
    console: Console,
    result: RunResult,
    copied: int,
    against: PairAgreement | None,
    source: Path,
    new: Path,
) -> None:
    """After a rejudge: the failures copied from the source, then (unless a shard) the
    summary, what moved against the source and where the report is."""
    if copied:
        console.print(
            f"{copied} of the failed records failed before the judge in the source run "
            "(copied with their error)",
            highlight=False,
        )
    if result.report is None:  # a shard: `cts merge` writes the report
        return
    print_summary(console, result.report.summary)
    if against is not None:
        _against_source(console, against, source, new)
    console.print(f"report: {result.report.html} (and report.md, summary.json, figures/)")


def _against_source(console: Console, against: PairAgreement, source: Path, new: Path) -> None:
    """What moved from the source's labels: the judge's noise floor when it is the same."""
    if against.movement is None:
        return
    if against.same_judge:
        console.print(
            "against the source, with the same judge (so this is its same-judge noise floor): "
            f"{moved(against.movement)}",
            highlight=False,
        )
        return
    console.print(
        f"against the source's judge: {moved(against.movement)}. To tell this from re-reading "
        f"noise, measure the judges' noise floors (`cts rejudge {source} --output-dir X` with "
        f"the source's judge, then `cts judge agreement {source} X {new}`)",
        highlight=False,
    )


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
    print_summary(output_console(), files.summary)
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
    console = output_console()
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
