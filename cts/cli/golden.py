"""`cts golden build|merge|audit`: golden construction, once per dataset, and its audit."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from cts.cli.common import command, command_group, output_console, run_keyed, usage_error
from cts.cli.options import (
    CONFIG_OPTION,
    SERVING,
    SET_OPTION,
    SHARD_OPTION,
    VITAL_FROM_OPTION,
    WEIGHT_MAP_OPTION,
    checked_output_dir,
    output_dir_option,
    shard_of,
)
from cts.eval.audit.citations import load_audit_dataset
from cts.eval.audit.golden_review import (
    audit_golden,
    figure_rows,
    findings,
    review_title,
    unsupported,
)
from cts.eval.data.golden import GoldenReport
from cts.eval.experiment import GOLDEN_ROLES, build_golden, finish_golden, require_roles
from cts.eval.interop.nuggetizer import Format, parse_weight_map
from cts.eval.interop.nuggetizer_transfer import (
    ImportReport,
    import_nuggets,
    nugget_rows,
    write_jsonl,
)
from cts.eval.run.config import load_experiment
from cts.eval.run.records import MergeReport
from cts.eval.run.run_dir import RunDir
from cts.foundation.yaml_config import Override
from cts.serving.server_group import ServeOptions

app = command_group(
    "Golden construction (once per dataset): WebDancer on each fused query, its trace "
    "archived, weighted nuggets extracted from it that cite only evidence the trace showed."
)


@command(app, "build")
def build(
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    output_dir: Path | None = output_dir_option(
        "Where records, traces and dataset.jsonl go (default runs/<name>-golden)."
    ),
    limit: int | None = typer.Option(None, help="Only the first N instances of the dataset."),
    shard: str | None = SHARD_OPTION,
    retry_failed: bool = typer.Option(
        False, "--retry-failed", help="Search again for instances that got no nuggets."
    ),
    options: ServeOptions = SERVING,
) -> None:
    """Build golden nuggets for the experiment's dataset (its config needs roles.nugget_builder).

    For each instance: the searcher (WebDancer) on the fused query with golden.seed (default
    1000; never an evaluation seed, and cached apart from evaluation runs, so that the oracle
    condition is a fresh run; a greedy searcher on the same model still decodes the same
    trajectory, and the evaluation's report warns), its trace kept under traces/golden/, then
    the nugget_builder role lists weighted nuggets (3 essential, 2 important, 1 context) whose
    source_ids can only be evidence ids that trace showed (corpus doc ids, or URLs with web
    search). Resumes like `cts run`; a sharded build is finished by `cts golden merge`. The
    result, OUTPUT_DIR/dataset.jsonl, is the dataset with `golden` filled in: point an
    experiment's dataset.path at it."""
    limited = [Override(("dataset", "limit"), limit, "--limit")] if limit is not None else []
    overrides: list[str | Override] = [*set_, *limited]
    part = shard_of(shard)
    resolved = load_experiment(config, overrides)
    require_roles(resolved, GOLDEN_ROLES)  # before any server is started for the build
    run = RunDir(checked_output_dir(output_dir) or resolved.golden_dir())
    console = output_console()
    console.print(
        f"golden construction for [bold]{resolved.experiment.name}[/bold] → {run.root}",
        highlight=False,
    )
    run_keyed(
        resolved,
        run,
        part,
        options,
        lambda ready, part, watch, progress: build_golden(
            ready,
            run.root,
            shard=part,
            show_progress=progress,
            watch=watch,
            retry_failed=retry_failed,
        ),
        console,
        merge_with=f"cts golden merge {run.root}",
        noun="instances searched",
    )
    if part.count > 1:
        return
    _finish(run.root, console)


@command(app, "merge")
def merge(run_dir: Path = typer.Argument(..., help="The golden construction directory.")) -> None:
    """Check every instance has its golden record (across shards), then write dataset.jsonl
    and golden_summary.json. Exit 1 when records are missing or some instance got no nuggets
    (those are listed with why; the others are written); 2, writing nothing, when the dataset
    changed since the build (its fingerprint.dataset, as a resumed build checks)."""
    _finish(run_dir, output_console())


def _finish(run_dir: Path, console: Console) -> None:
    merged, report = finish_golden(run_dir)
    if report is None:
        _gaps(merged, run_dir)
        raise typer.Exit(1)
    console.print(_summary_table(report))
    for instance_id, why in list(report.failed.items())[:20]:
        console.print(f"no nuggets for {instance_id}: {why}", highlight=False)
    console.print(
        f"dataset with golden nuggets: {report.dataset}\nuse it in an experiment:\n"
        f"  dataset: {{path: {report.dataset}}}",
        highlight=False,
    )
    if report.failed:
        typer.echo(
            f"{len(report.failed)} instance(s) got no nuggets and are left out of the dataset; "
            "`cts golden build --retry-failed` (same options) tries them again",
            err=True,
        )
        raise typer.Exit(1)


def _gaps(merged: MergeReport, run_dir: Path) -> None:
    for key in merged.missing[:20]:
        typer.echo(f"missing: {key[0]}")
    for key in merged.duplicates[:20]:
        typer.echo(f"duplicate: {key[0]}")
    typer.echo(
        f"{len(merged.missing)} missing, {len(merged.duplicates)} duplicated instances in "
        f"{run_dir}",
        err=True,
    )


def _summary_table(report: GoldenReport) -> Table:
    table = Table("instances with nuggets", "without", "nuggets", "per instance", "weights 3/2/1")
    per = report.nuggets / report.built if report.built else 0.0
    weights = "/".join(str(report.weights.get(w, 0)) for w in (3, 2, 1))
    table.add_row(
        str(report.built), str(len(report.failed)), str(report.nuggets), f"{per:.1f}", weights
    )
    return table


@command(app, "audit")
def audit(
    dataset: str = typer.Argument(
        ...,
        help="A dataset with golden nuggets (any format `cts data` reads), a golden "
        "construction folder (its dataset.jsonl and traces), or `sample`.",
    ),
    corpus: str | None = typer.Option(
        None,
        help="Corpus JSONL the citations name (`sample` = the shipped one). Default: the "
        "experiment's (or the golden folder's) corpus; `sample` for the sample dataset.",
    ),
    split: str | None = typer.Option(None, help="Split (for `sample` and `datasets` sources)."),
    sample: int = typer.Option(20, min=0, help="Nuggets in the review sample."),
    seed: int = typer.Option(0, help="Seed of the review sample's draw."),
    limit: int | None = typer.Option(None, min=1, help="Only the first N instances."),
    config: str | None = typer.Option(
        None,
        "--config",
        "-c",
        help="Experiment whose judge role's model checks grounding (without one, or with "
        "--lexical: the lexical pre-filter).",
    ),
    set_: list[str] = SET_OPTION,
    lexical: bool = typer.Option(
        False, "--lexical", help="Check grounding lexically even when an experiment is given."
    ),
    out: Path | None = typer.Option(
        None, help="Where audit.json and sample.md go (default runs/golden-audit-NAME)."
    ),
) -> None:
    """Audit golden nuggets: nuggets per instance, weight mix, sources per nugget, instances
    with fewer than 3 nuggets, near-duplicate nuggets within an instance, and a grounding check
    of each nugget against the evidence it cites (corpus documents, or what its golden trace
    showed): support / partial / none, by the judge role's model with its own prompt when an
    experiment is given, else by lexical overlap. Writes audit.json (every figure with its n,
    every nugget's verdict) and sample.md (a random sample of nuggets with the cited text
    closest to each, for a person to check). Exit 1, listing them, when a nugget cites nothing
    that supports it (no citation, citations that resolve to nothing, or verdict none) or the
    model failed on some; 2 for bad input, or a judge whose model answers no chat request (the
    lexical judge: audit with --lexical, or name a language model as roles.judge)."""
    if set_ and config is None:
        raise usage_error("--set changes an experiment: give it with -c/--config")
    review = audit_golden(
        dataset,
        corpus=corpus,
        split=split,
        limit=limit,
        resolved=load_experiment(config, set_) if config is not None else None,
        lexical=lexical,
        out=out,
        sample=sample,
        seed=seed,
    )
    table = Table("figure", "value", "n", title=review_title(review))
    for row in figure_rows(review.audit):
        table.add_row(*row)
    console = output_console()
    console.print(table)
    for line in findings(review.audit):
        typer.echo(line)
    console.print(
        f"audit.json and sample.md ({len(review.drawn)} nuggets) in {review.folder}",
        highlight=False,
    )
    if review.failed:
        lines, count = unsupported(review.audit)
        for line in lines:
            typer.echo(line)
        typer.echo(count, err=True)
        raise typer.Exit(1)


# -- nuggetizer interoperability (cts/eval/interop/nuggetizer.py)
# ----------------------------------------


@command(app, "import")
def import_command(
    nuggets_file: Path = typer.Argument(
        ..., help="A nuggets JSONL as `nuggetizer create` writes it: {qid, query, nuggets}."
    ),
    from_: Format = typer.Option(..., "--from", help="The file's format."),
    dataset: str = typer.Option(
        ..., help="The dataset (our shape, any format `cts data` reads) or `sample`."
    ),
    out: Path = typer.Option(..., help="Where the merged dataset (JSONL) goes."),
    weight_map: str = WEIGHT_MAP_OPTION,
    replace: bool = typer.Option(
        False, "--replace", help="Drop an imported instance's nuggets the file does not have."
    ),
    split: str | None = typer.Option(None, help="Split (for `sample` and `datasets` sources)."),
) -> None:
    """Merge nuggetizer's nuggets into a dataset's golden nuggets, by qid = instance id
    (https://github.com/castorini/nuggetizer, its README's `create` output shape).

    Each nugget's importance becomes a weight by --weight-map (default vital=3, okay=1; a
    nugget without one is vital, as nuggetizer reads it). A nugget whose text (spacing aside)
    the instance already has keeps its id and source_ids and takes the file's weight; a new one
    gets the next free id nK and no source_ids — nuggetizer files carry no evidence, so `cts
    golden audit` flags such nuggets as citing nothing, rightly, until their sources are added.
    When the instance has the text in several nuggets, each takes the weight. With --replace,
    the imported instances' other nuggets are dropped. Instances the file does not name are
    written unchanged (`sample` is all of its splits, train included, as `golden export` and
    `golden audit` read it; --split narrows it). Exit 2, before anything is written, when a qid
    names no instance, an importance is not in the map, or a line is malformed (each as
    file:line)."""
    weights = parse_weight_map(weight_map)
    report = import_nuggets(nuggets_file, dataset, out, weights, replace, split)
    _import_summary(report, out, from_)


def _import_summary(report: ImportReport, out: Path, source: Format) -> None:
    typer.echo(
        f"{len(report.updated)} of {report.instances} instances got {source.value} nuggets: "
        f"{report.added} added, {report.matched} matched by text ({report.reweighted} "
        f"reweighted), {report.dropped} dropped → {out}"
    )
    if report.defaulted_importance:
        typer.echo(f"{report.defaulted_importance} nugget(s) had no importance: read as vital")
    if report.other_query:
        typer.echo(
            f"note: {len(report.other_query)} qid(s) carry a query that is neither the instance's "
            f"fused nor its blurred query (e.g. {report.other_query[0]}): check the ids match"
        )
    if report.without_sources:
        typer.echo(
            f"note: {report.without_sources} nugget(s) of the imported instances cite no "
            f"evidence; `cts golden audit {out}` will flag them until source_ids are added"
        )


@command(app, "export")
def export_command(
    dataset: str = typer.Argument(
        ..., help="A dataset with golden nuggets, a golden construction folder, or `sample`."
    ),
    to: Format = typer.Option(..., help="The format to write."),
    out: Path = typer.Option(..., help="The nuggets JSONL to write."),
    weight_map: str = WEIGHT_MAP_OPTION,
    vital_from: float | None = VITAL_FROM_OPTION,
    split: str | None = typer.Option(None, help="Split (for `sample` and `datasets` sources)."),
) -> None:
    """Write a dataset's golden nuggets as nuggetizer's nuggets file, one line {query, qid,
    nuggets: [{text, importance}]} per instance with nuggets (query: the fused query), for
    `nuggetizer assign --nuggets`. A weight at or above --vital-from is vital, any other okay
    (defaults: weight 3 → vital, 2 and 1 → okay; importing back gives weights by the same
    --weight-map, so weight 2 returns as 1). Ids and source_ids are not in the format."""
    weights = parse_weight_map(weight_map, vital_from)
    instances = load_audit_dataset(dataset, split).instances
    written = write_jsonl(nugget_rows(instances, weights), out)
    skipped = len(instances) - written
    typer.echo(
        f"{written} instance(s) with golden nuggets written as {to.value} nuggets → {out} "
        f"({weights.describe()})" + (f"; {skipped} without nuggets left out" if skipped else "")
    )
