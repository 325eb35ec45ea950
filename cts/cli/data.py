"""`cts data validate|stats`: datasets and corpora checked and described; `cts data fuse|blur`
(cts/cli/build.py): a benchmark built from your own queries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from cts.cli import build
from cts.cli.common import command, command_group, output_console, usage_error
from cts.cli.options import SET_OPTION
from cts.eval.data.data_stats import dataset_stats
from cts.eval.data.dataset import (
    SAMPLE_SPLITS,
    Checked,
    DatasetSource,
    GoldTable,
    check_source,
    corpus_path,
)
from cts.eval.data.readers import DatasetError, read_rows
from cts.eval.data.schema import Instance
from cts.eval.experiment import no_nuggets, unscored_note
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.webdancer.corpus import CorpusError, Problem, check_corpus

app = command_group(
    "Validate and describe datasets and corpora; build a benchmark from your own queries "
    "(fuse, blur), or draw a synthetic one (synth)."
)

PATH_HELP = (
    "A dataset (JSONL, JSON, CSV, TSV, Parquet, a folder or hub id for `datasets`), a corpus "
    "JSONL, or `sample` for the shipped benchmark. Not with --config."
)
STATS_PATH_HELP = (
    "A dataset (JSONL, JSON, CSV, TSV, Parquet, a folder or hub id for `datasets`), or `sample` "
    "for the shipped benchmark; not a corpus (`cts data validate` checks one). Not with --config."
)
DATA_CONFIG_OPTION = typer.Option(
    None,
    "--config",
    "-c",
    help="Instead of PATH: the dataset an experiment's `dataset:` section describes (field maps, "
    "gold table, nugget_field_map, weight_map, corpus), read exactly as `cts run -c` reads it.",
)


def _experiment(
    path: str | None, config: str | None, set_: list[str], **path_options: object
) -> ResolvedExperiment | None:
    """The experiment whose dataset is checked, or None when PATH is (exit 2 for a mix)."""
    if config is None:
        if set_:
            raise usage_error("--set changes an experiment: give it with --config/-c")
        if path is None:
            raise usage_error("give a dataset PATH, or an experiment with --config/-c")
        return None
    if path is not None:
        raise usage_error(f"give PATH ({path}) or --config ({config}), not both")
    given = [f"--{k.replace('_', '-')}" for k, v in path_options.items() if v]
    if given:
        raise usage_error(
            f"{', '.join(given)}: with --config the experiment's `dataset:` says it; change it "
            "with --set dataset.KEY=VALUE"
        )
    return load_experiment(config, set_)


def _whole(resolved: ResolvedExperiment) -> DatasetSource:
    """The experiment's dataset as `cts run` validates it: every row, whatever the limit."""
    return resolved.experiment.dataset.model_copy(update={"limit": None})


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
    """Whether PATH holds corpus documents: its first row that parses has a doc_id. Not the
    first row alone: a malformed first line (a truncated write) would make a corpus a dataset
    whose every row is reported, and the one line that is wrong drowned among them."""
    if path == "sample":
        return False
    first = next((row for row in read_rows(path) if row.data is not None), None)
    return first is not None and first.data is not None and "doc_id" in first.data


def _golden_notes(source: DatasetSource, instances: list[Instance]) -> list[str]:
    """What `cts run` would say of the instances' golden nuggets: some lacking them run
    unscored (a note), none having them is refused (valid for `cts golden build`)."""
    unscorable = no_nuggets(source, instances) if instances else None
    if unscorable is not None:
        return [f"warning: {unscorable} (`cts run` refuses it)"]
    note = unscored_note(instances)
    return [] if note is None else [note]


@command(app, "validate")
def data_validate(
    path: str | None = typer.Argument(None, help=PATH_HELP),
    split: str | None = typer.Option(None, help="Split (for `sample` and `datasets` sources)."),
    corpus: str | None = typer.Option(None, help="Corpus JSONL that nugget source_ids must be in."),
    field_map: list[str] = typer.Option([], help="OURS=THEIRS column rename (repeatable)."),
    gold: str | None = typer.Option(None, help="A separate gold table joined by id."),
    gold_id_field: str = typer.Option("id", help="The id column of the gold table."),
    config: str | None = DATA_CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
) -> None:
    """Check every row of a dataset or corpus and report every problem.

    Problems print as `file:line: field: message`; the exit code is 1 when there is any. With
    --config, the dataset of an experiment, every row of it as `cts run -c` loads it."""
    resolved = _experiment(
        path,
        config,
        set_,
        split=split,
        corpus=corpus,
        field_map=field_map,
        gold=gold,
        gold_id_field=gold_id_field != "id",
    )
    if resolved is not None:
        _validate_experiment(resolved)
        return
    assert path is not None
    splits = list(SAMPLE_SPLITS) if path == "sample" and split is None else [split]
    sources = [_source(path, one, corpus, field_map, gold, gold_id_field) for one in splits]
    problems, count, notes = _check_path(path, sources)
    for problem in problems:
        typer.echo(str(problem))
    if problems:
        typer.echo(f"{len(problems)} problem(s) in {path}", err=True)
        raise typer.Exit(1)
    for note in notes:
        typer.echo(note, err=True)  # not a problem: the exit code stays 0
    typer.echo(f"{path}: OK ({count})")


def _check_path(path: str, sources: list[DatasetSource]) -> tuple[list[Problem], str, list[str]]:
    """Every problem of PATH (a corpus, or the dataset `sources` read), what it holds, and
    the notes on its golden nuggets."""
    try:
        if _is_corpus(path):
            documents, problems = check_corpus(Path(path))
            return problems, f"{len(documents)} documents", []
        problems, total, notes = [], 0, []
        for source in sources:
            checked = check_source(source)
            problems += checked.problems
            total += len(checked.instances)
            notes += _golden_notes(source, checked.instances)
        count = f"{total} instances"
        if path == "sample":
            documents, corpus_problems = check_corpus(corpus_path("sample"))
            problems += corpus_problems
            count += f", {len(documents)} documents"
        return problems, count, notes
    except (DatasetError, CorpusError) as e:
        return list(e.problems), "nothing", []


def _validate_experiment(resolved: ResolvedExperiment) -> None:
    source = _whole(resolved)
    try:
        checked = check_source(source)
        problems = checked.problems
    except (DatasetError, CorpusError) as e:
        problems = e.problems
    label = f"{source.path} (the dataset of {resolved.path})"
    for problem in problems:
        typer.echo(str(problem))
    if problems:
        typer.echo(f"{len(problems)} problem(s) in {label}", err=True)
        raise typer.Exit(1)
    limit = resolved.experiment.dataset.limit
    used = checked.instances[:limit] if limit else checked.instances
    for note in _golden_notes(source, used):
        typer.echo(note, err=True)  # not a problem: the exit code stays 0
    count = f"{len(checked.instances)} instances" + (
        f"; the experiment runs the first {len(used)}" if limit else ""
    )
    typer.echo(f"{label}: OK ({count})")


def _experiment_stats(resolved: ResolvedExperiment) -> tuple[str, dict[str, Any]]:
    """The statistics of the instances the experiment runs: its dataset loaded as `cts run`
    loads it (a dataset it would refuse is refused here: exit 1), then its limit."""
    checked = check_source(_whole(resolved))
    if checked.problems:
        typer.echo(
            f"{_invalid(checked)}: `cts run` refuses this dataset; "
            f"`cts data validate -c {resolved.path}` lists them",
            err=True,
        )
        raise typer.Exit(1)
    dataset = resolved.experiment.dataset
    used = checked.instances[: dataset.limit] if dataset.limit else checked.instances
    name = resolved.experiment.name
    if dataset.limit:
        name += f" (the first {len(used)} of {len(checked.instances)})"
    return dataset.path, {name: dataset_stats(used)}


@command(app, "stats")
def data_stats(
    path: str | None = typer.Argument(None, help=STATS_PATH_HELP),
    split: str | None = typer.Option(None, help="Split (for `sample` and `datasets` sources)."),
    field_map: list[str] = typer.Option([], help="OURS=THEIRS column rename (repeatable)."),
    gold: str | None = typer.Option(None, help="A separate gold table joined by id."),
    gold_id_field: str = typer.Option("id", help="The id column of the gold table."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    config: str | None = DATA_CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
) -> None:
    """Counts per language and removed-constraint type, nuggets, weights, query lengths.

    With --config, of the instances an experiment runs (its dataset, after its limit)."""
    resolved = _experiment(
        path,
        config,
        set_,
        split=split,
        field_map=field_map,
        gold=gold,
        gold_id_field=gold_id_field != "id",
    )
    if resolved is not None:
        path, report = _experiment_stats(resolved)
    else:
        assert path is not None
        if _is_corpus(path):
            # Its documents are no instances: statistics of none would read as an empty dataset.
            raise usage_error(
                f"{path} is a corpus (its rows have doc_id): `cts data stats` describes a "
                f"dataset; `cts data validate {path}` checks a corpus"
            )
        report = {}
        for one in list(SAMPLE_SPLITS) if path == "sample" and split is None else [split]:
            source = _source(path, one, None, field_map, gold, gold_id_field)
            checked = check_source(source.model_copy(update={"corpus": None}))
            if checked.problems:
                typer.echo(f"{_invalid(checked)}; run `cts data validate {path}`", err=True)
            report[one or path] = dataset_stats(checked.instances)
    if as_json:
        typer.echo(json.dumps(report, indent=2, ensure_ascii=False))
        return
    for name, stats in report.items():
        _print_stats(path, name, stats)


def _invalid(checked: Checked) -> str:
    """How many rows `checked` left out, and how many problems it found: a row may have
    several, and a problem may be no row's (a gold table's, an empty file)."""
    problems = len(checked.problems)
    return f"{checked.invalid_rows} invalid row(s) skipped ({problems} problem(s))"


def _print_stats(path: str, name: str, stats: dict[str, Any]) -> None:
    """One dataset's statistics as a table, then its removed spans' lengths when it records
    spans (a row of JSON would hide which n each figure stands on)."""
    table = Table("statistic", "value", title=f"{path} · {name}")
    cells = {"removed_spans": _spans_cell, "removed_constraint_shares": _shares_cell}
    for key, value in stats.items():
        table.add_row(key, cells.get(key, _json)(value))
    output_console().print(table)
    lengths = stats.get("removed_spans", {}).get("span_units", {})
    if lengths:
        spans = Table(
            "language",
            "spans (n)",
            "min",
            "median",
            "mean",
            "max",
            title=f"{name}: removed span length",
            caption="in units: a word, or one CJK character",
        )
        for language, found in lengths.items():
            figures = (found[k] for k in ("n", "min", "median", "mean", "max"))
            spans.add_row(language, *(f"{f:g}" for f in figures))
        output_console().print(spans)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _shares_cell(mix: dict[str, Any]) -> str:
    """The removed-type mix as percentages of the n removed constraints they stand on."""
    if not mix["n"]:
        return "no removed constraints"
    shares = ", ".join(f"{kind} {100 * share:.0f}%" for kind, share in mix["shares"].items())
    return f"of {mix['n']}: {shares}"


def _spans_cell(spans: dict[str, Any]) -> str:
    """How many removed constraints record their span, of all of them."""
    with_span = spans["with_span"]
    if not with_span["count"]:
        return f"no spans recorded (0 of {with_span['n']} removed constraints)"
    return (
        f"{with_span['count']} of {with_span['n']} removed constraints have a span "
        f"({100 * with_span['share']:.0f}%; lengths below)"
    )


command(app, "fuse")(build.fuse)
command(app, "blur")(build.blur)
command(app, "synth")(build.synth)
