"""`cts run`, `cts config …` and `cts models check`: experiment-level commands. Thin: parse
options, call a function, print."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from eval.config import ResolvedExperiment, load_experiment
from eval.data_stats import dataset_stats
from eval.dataset import (
    SAMPLE_SPLITS,
    DatasetError,
    DatasetSource,
    GoldTable,
    check_source,
    corpus_path,
    read_rows,
)
from eval.engines import open_engines
from eval.model_check import DEFAULT_PROMPT, ModelCheck, check_models
from eval.report import MAIN_COLUMNS, report_cell, warnings, write_report
from eval.run import RunResult, merge_run, run_experiment
from eval.runner import RecordFileError
from eval.search_agent import build_agent
from eval.serve_cli import (
    CPU_OPTION,
    ENDPOINTS_OPTION,
    GPUS_OPTION,
    SERVE_OPTION,
    VLLM_PYTHON_OPTION,
    ServeOptions,
    parse_shard,
    run_exits,
    served,
)
from serving.yaml_config import ConfigError
from webdancer.agent import AgentResult
from webdancer.corpus import CorpusError, check_corpus
from webdancer.tool_cache import ToolCacheMiss

CONFIG_HELP = "Experiment YAML (a path, or a name under configs/experiments/). Default: quickstart."
SET_HELP = "Override a config key, e.g. --set roles.clarifier.model=qwen3-8b (repeatable)."

config_app = typer.Typer(help="Inspect experiment configs.", no_args_is_help=True)


def _load(config: str | None, overrides: list[str]) -> ResolvedExperiment:
    try:
        return load_experiment(config, overrides)
    except ConfigError as e:
        typer.echo(f"config error\n{e}", err=True)
        raise typer.Exit(2) from None


@config_app.command("show")
def config_show(
    config: str | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Print the resolved config: the experiment with every role's model config filled in."""
    print(_load(config, set_).to_yaml(), end="")


def _checks_table(checks: list[ModelCheck]) -> Table:
    table = Table("model", "engine", "roles", "answer", "tokens in/out", "tok/s", "cached")
    for c in checks:
        answer = f"[red]{c.error}[/red]" if c.error else c.text
        table.add_row(
            c.model,
            c.engine,
            ", ".join(c.roles),
            answer,
            f"{c.prompt_tokens}/{c.completion_tokens}",
            "–" if c.cached or c.error else f"{c.tokens_per_s:.1f}",
            "yes" if c.cached else "no",
        )
    return table


def models_check(
    role: str = typer.Option(..., "--role", "-r", help="Role whose configured model to check."),
    config: str | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    prompt: str = typer.Option(DEFAULT_PROMPT, help="The prompt to send."),
    structured: bool = typer.Option(False, help="Ask for a JSON-schema constrained answer."),
) -> None:
    """Send one prompt through a role's model and print the answer and tokens/s.

    Uses the engine the experiment configures for ROLE, without the response cache, and prints
    the answer, prompt and completion token counts and completion tokens per second (the time
    includes loading the model on first use)."""
    resolved = _load(config, set_)
    if role not in resolved.experiment.roles:
        roles = ", ".join(resolved.experiment.roles)
        typer.echo(f"unknown role {role!r}; this config has: {roles}", err=True)
        raise typer.Exit(2)
    checks, _ = asyncio.run(
        check_models(resolved, [role], prompt, structured=structured, use_cache=False)
    )
    Console().print(_checks_table(checks))
    if checks[0].error:
        raise typer.Exit(1)


def run(
    config: str | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    output_dir: Path | None = typer.Option(None, help="Run directory (default from config)."),
    limit: int | None = typer.Option(None, help="Only the first N instances of the dataset."),
    shard: str | None = typer.Option(None, help="Run shard I/N of the instances (e.g. 0/4)."),
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
    overrides = [*set_, *([f"dataset.limit={limit}"] if limit is not None else [])]
    resolved = _load(config, overrides)
    part = parse_shard(shard)
    out = output_dir or resolved.output_dir()
    console = Console()
    console.print(
        f"experiment [bold]{resolved.experiment.name}[/bold] from {resolved.path} → {out}",
        highlight=False,
    )
    options = ServeOptions(endpoints, serve, gpus, cpu, vllm_python)
    logs = out / "logs" / "serve" / part.name
    with run_exits(), served(resolved, options, logs, console) as (ready, watch):
        result = run_experiment(ready, out, part, watch=watch, retry_failed=retry_failed)
    print_outcome(console, result)
    if result.report is None:
        console.print(
            f"shard {part.index}/{part.count} done; when every shard is done: cts merge {out}"
        )
        return
    print_summary(console, result.report["summary"])
    console.print(f"report: {result.report['html']} (and report.md, summary.json, figures/)")


def print_outcome(console: Console, result: RunResult) -> None:
    """The run's one-line account; an interrupted run exits 130 (it resumes when rerun)."""
    outcome = result.outcome
    console.print(
        f"{outcome.ran} records written, {outcome.skipped} already done, "
        f"{sum(outcome.failures.values())} failed {dict(outcome.failures)}; "
        f"{result.model_calls} model calls, cache {result.cache}; {result.seconds:.0f} s",
        highlight=False,
    )
    if outcome.interrupted:
        console.print("interrupted: finished records are saved; run the same command to resume")
        raise typer.Exit(130)


def main_table(summary_path: Path) -> Table:
    summary = json.loads(summary_path.read_text())
    report = summary["report"]
    policy = report["failure_policy"]
    table = Table(
        "system",
        *MAIN_COLUMNS,
        title="restore_score_100 [95% CI] (n instances; f instances with a failed record)",
        caption=f"paired on {report['paired_instances']} instances; failures: "
        + ("scored 0" if policy == "zero" else "excluded"),
    )
    for name, system in summary["systems"].items():
        # Text, not markup: a name like "quickstart (x) [runs-a]" must print as it is.
        table.add_row(
            Text(name), *(Text(report_cell(system["scores"].get(c), policy)) for c in MAIN_COLUMNS)
        )
    return table


def merge_command(run_dir: Path = typer.Argument(..., help="The run directory.")) -> None:
    """Check a sharded run is complete, then write its summary and report.

    Every (instance, condition, seed) of the run's config must be recorded exactly once across
    the shard files; missing and duplicated keys are listed and the exit code is 1."""
    try:
        report = merge_run(run_dir)
    except (RecordFileError, FileNotFoundError) as e:
        typer.echo(f"merge error: {e}", err=True)
        raise typer.Exit(1) from None
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
    print_summary(Console(), run_dir / "summary.json")
    typer.echo(f"merged {len(report.records)} records; report: {run_dir / 'report.html'}")


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
) -> None:
    """Combine runs into one report: main table (one row per system, paired on the instances
    every run scored), systems compared pairwise per condition (paired bootstrap CI, sign-flip
    test, Holm across k), diagnostics and figures."""
    if failures not in (None, "exclude", "zero"):
        typer.echo(f"--failures {failures!r}: expected exclude or zero", err=True)
        raise typer.Exit(2)
    if min_gap is not None and not min_gap > 0:
        typer.echo(f"--min-gap {min_gap}: must be a positive number of points", err=True)
        raise typer.Exit(2)
    missing = [d for d in run_dirs if not (d / "config.yaml").is_file()]
    if missing:
        typer.echo(f"not a run directory (no config.yaml): {missing[0]}", err=True)
        raise typer.Exit(2)
    paths = write_report(run_dirs, out, failures, min_gap)  # type: ignore[arg-type]
    print_summary(Console(), paths["summary"])
    typer.echo(f"report: {paths['html']}")


def print_summary(console: Console, summary_path: Path) -> None:
    """The main table and the warnings a reader must not miss."""
    console.print(main_table(summary_path))
    for name, system in json.loads(summary_path.read_text())["systems"].items():
        for line in warnings(name, system):
            console.print(line, style="yellow", highlight=False, markup=False)


data_app = typer.Typer(help="Validate and describe datasets and corpora.", no_args_is_help=True)

PATH_HELP = (
    "A dataset (JSONL, JSON, CSV, TSV, Parquet, a folder or hub id for `datasets`), a corpus "
    "JSONL, or `sample` for the shipped benchmark."
)


def _source(
    path: str,
    split: str | None,
    corpus: str | None,
    field_map: list[str],
    gold: str | None,
    gold_id_field: str,
) -> DatasetSource:
    mapping = {}
    for item in field_map:
        ours, sep, theirs = item.partition("=")
        if not sep:
            typer.echo(f"--field-map {item!r}: expected OURS=THEIRS, e.g. id=qid", err=True)
            raise typer.Exit(2)
        mapping[ours] = theirs
    return DatasetSource(
        path=path,
        split=split,
        field_map=mapping,
        corpus=corpus,
        gold=GoldTable(path=gold, id_field=gold_id_field) if gold else None,
    )


def _is_corpus(path: str) -> bool:
    first = next(iter(read_rows(path)), None) if path != "sample" else None
    return first is not None and first.data is not None and "doc_id" in first.data


@data_app.command("validate")
def data_validate(
    path: str = typer.Argument(..., help=PATH_HELP),
    split: str | None = typer.Option(None, help="Split (for `sample` and `datasets` sources)."),
    corpus: str | None = typer.Option(None, help="Corpus JSONL that nugget source_ids must be in."),
    field_map: list[str] = typer.Option([], help="OURS=THEIRS column rename (repeatable)."),
    gold: str | None = typer.Option(None, help="A separate gold table joined by id."),
    gold_id_field: str = typer.Option("id", help="The id column of the gold table."),
) -> None:
    """Check every row of a dataset or corpus and report every problem.

    Problems print as `file:line: field: message`; the exit code is 1 when there is any."""
    try:
        if _is_corpus(path):
            documents, problems = check_corpus(Path(path))
            count = f"{len(documents)} documents"
        else:
            splits = list(SAMPLE_SPLITS) if path == "sample" and split is None else [split]
            problems, total = [], 0
            for one in splits:
                checked = check_source(_source(path, one, corpus, field_map, gold, gold_id_field))
                problems += checked.problems
                total += len(checked.instances)
            if path == "sample":
                documents, corpus_problems = check_corpus(corpus_path("sample"))
                problems += corpus_problems
            count = f"{total} instances" + (
                f", {len(documents)} documents" if path == "sample" else ""
            )
    except (DatasetError, CorpusError) as e:
        problems, count = e.problems, "nothing"
    for problem in problems:
        typer.echo(str(problem))
    if problems:
        typer.echo(f"{len(problems)} problem(s) in {path}", err=True)
        raise typer.Exit(1)
    typer.echo(f"{path}: OK ({count})")


@data_app.command("stats")
def data_stats(
    path: str = typer.Argument(..., help=PATH_HELP),
    split: str | None = typer.Option(None, help="Split (for `sample` and `datasets` sources)."),
    field_map: list[str] = typer.Option([], help="OURS=THEIRS column rename (repeatable)."),
    gold: str | None = typer.Option(None, help="A separate gold table joined by id."),
    gold_id_field: str = typer.Option("id", help="The id column of the gold table."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Counts per language and removed-constraint type, nuggets, weights, query lengths."""
    splits = list(SAMPLE_SPLITS) if path == "sample" and split is None else [split]
    report = {}
    for one in splits:
        source = _source(path, one, None, field_map, gold, gold_id_field)
        checked = check_source(source.model_copy(update={"corpus": None}))
        if checked.problems:
            typer.echo(
                f"{len(checked.problems)} invalid row(s) skipped; run `cts data validate`", err=True
            )
        report[one or path] = dataset_stats(checked.instances)
    if as_json:
        typer.echo(json.dumps(report, indent=2, ensure_ascii=False))
        return
    for name, stats in report.items():
        table = Table("statistic", "value", title=f"{path} · {name}")
        for key, value in stats.items():
            table.add_row(key, json.dumps(value, ensure_ascii=False))
        Console().print(table)


def search(
    question: str = typer.Argument(..., help="The question to search for."),
    config: str | None = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    tools_offline: bool = typer.Option(
        False, "--tools-offline", help="Replay tool calls from the tool cache; a miss is an error."
    ),
    trace: Path | None = typer.Option(None, help="Write the full trace (JSON) to this file."),
) -> None:
    """Run the WebDancer agent on one question with the configured searcher and tools.

    Prints the answer, why the run ended, and the documents the tools showed the model."""
    resolved = _load(config, [*set_, *(["search.offline=true"] if tools_offline else [])])

    async def go() -> AgentResult:
        async with open_engines(resolved, ["searcher", "summarizer"]) as engines:
            return await build_agent(resolved, engines).run(question)

    try:
        result = asyncio.run(go())
    except ToolCacheMiss as e:
        typer.echo(f"tool cache miss: {e}", err=True)
        raise typer.Exit(1) from None
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
