"""`cts data validate|stats`: datasets and corpora checked and described."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from cts.common import command
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
from webdancer.corpus import CorpusError, check_corpus

app = typer.Typer(help="Validate and describe datasets and corpora.", no_args_is_help=True)

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


@command(app, "validate")
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


@command(app, "stats")
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
