"""`cts judge …`: how far to trust the judge — agreement between two judgements of the same
answers, and calibration against human labels."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from cts.cli.common import (
    command,
    command_group,
    output_console,
    progress_for,
    role_experiment,
    usage_error,
    write_figures,
)
from cts.cli.options import (
    CONFIG_OPTION,
    ENDPOINTS_OPTION,
    SET_OPTION,
    VITAL_FROM_OPTION,
    WEIGHT_MAP_OPTION,
    labels_option,
)
from cts.eval.audit.agreement import (
    AgreementReport,
    Movement,
    NoiseFloor,
    PairAgreement,
    agreement,
    names_for,
)
from cts.eval.audit.calibration import PASSES, calibrate_experiment, render
from cts.eval.audit.judge_labels import read_labels
from cts.eval.audit.pairing import read_judgement
from cts.eval.interop.nuggetizer import Format, parse_weight_map
from cts.eval.interop.nuggetizer_transfer import export_assignments
from cts.eval.score.kappa import Kappa
from cts.eval.score.power import can_reject

app = command_group(
    "Trust the judge: agreement between two judgements of the same answers, calibration "
    "against human labels."
)


@command(app, "calibrate")
def calibrate(
    labels: str = labels_option(
        "Human-labelled JSONL, one {answer, nugget, label} per line (optional query, "
        "language, group, nugget_id, id, note); `sample`: the set shipped with the toolkit."
    ),
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    out: Path | None = typer.Option(None, help="Also write the figures as JSON here."),
    endpoints: Path | None = ENDPOINTS_OPTION,
    passes: str = typer.Option(
        "all",
        help="all: listed, shuffled and rerun; agreement: the listed pass alone (κ and the "
        "confusion matrix in a third of the time, no order flip or rerun identity).",
    ),
) -> None:
    """The experiment's judge against people's labels: Cohen's κ (full/partial/none, and strict
    full-vs-rest) and the confusion matrix; the order flip (share of labels that change when
    each answer's nuggets are shuffled); the rerun identity (share that change when the same
    requests are sent again, response cache off); label rates by position in the batch and by
    answer length. The rows of one answer (same `group`, else the same answer text) are judged
    in one batch, as a run judges a record; every figure gives its n."""
    if passes not in PASSES:
        raise usage_error(f"--passes must be one of {', '.join(PASSES)}, got {passes!r}")
    labelled = read_labels(labels)  # a bad row is named before any model loads
    resolved, name = role_experiment(config, set_, endpoints, "judge")
    result = calibrate_experiment(resolved, labelled, progress_for(output_console()), passes)
    typer.echo(render(result, name))
    write_figures(out, "judge", name, result.as_dict())


def _pct(share: float | None) -> str:
    return "–" if share is None else f"{100 * share:.0f}%"


def _kappa(kappa: Kappa) -> str:
    if kappa.n == 0:
        return "– (n 0)"
    value = "undefined" if kappa.kappa is None else f"{kappa.kappa:.2f}"
    return f"{value} (agree {_pct(kappa.observed)}, n {kappa.n})"


def _points(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f}"


def moved(m: Movement) -> str:
    """Labels and score points that move, each with its n and CI."""
    if m.share is None:
        return "no label paired"
    text = (
        f"labels moved {m.changed} of {m.labels} ({100 * m.share:.1f}% "
        f"[{100 * (m.share_low or 0):.1f}, {100 * (m.share_high or 0):.1f}])"
    )
    if m.points is not None:
        text += (
            f"; scores moved on {m.records_moved} of {m.records} records, mean |Δ| "
            f"{m.points:.1f} points per record [{m.points_low or 0:.1f}, {m.points_high or 0:.1f}]"
        )
    return text + f"; 95% CIs over {m.instances} instances"


def _movement_lines(console: Console, found: PairAgreement, floors: list[NoiseFloor]) -> None:
    """What moves between the pair, beside the same-judge noise floor of each judge."""
    if found.movement is None:
        return
    if found.same_judge:
        console.print(
            f"same judge ({escape(found.judges[0])}) in both, so this is its noise floor: "
            f"{moved(found.movement)}",
            highlight=False,
        )
        return
    if found.replayed is not None:
        console.print(
            f"same judge ({escape(found.judges[0])}) in both, but the labels of "
            f"{escape(found.replayed)} are response-cache replays, not a second reading (no "
            f"noise floor; see the notes): {moved(found.movement)}",
            highlight=False,
        )
        return
    console.print(f"{moved(found.movement)}", highlight=False)
    for floor in floors:
        console.print(
            f"  beside: same-judge noise floor of {escape(floor.judge)} ({escape(floor.first)} vs "
            f"{escape(floor.second)}): {moved(floor.movement)}",
            highlight=False,
        )
    if not floors:
        console.print(
            "  no same-judge noise floor for either judge among the runs given (see the notes)",
            highlight=False,
        )


def _score_table(found: PairAgreement) -> Table:
    """The restore score per condition under each judgement, their difference and its MDE."""
    scores = Table(
        "condition",
        "n",
        escape(found.first),
        escape(found.second),
        "difference [95% CI]",
        "p",
        "MDE",
        title="restore_score_100, second minus first (paired on instances; MDE: the smallest "
        "true difference the test detects with 80% power at α = 0.05)",
    )
    for diff in found.scores:
        scores.add_row(
            diff.condition,
            str(diff.n),
            f"{diff.first:.1f}" if diff.first is not None else "–",
            f"{diff.second:.1f}" if diff.second is not None else "–",
            f"{_points(diff.difference)} [{_points(diff.low)}, {_points(diff.high)}]",
            f"{diff.p_value:.3f}" if diff.p_value is not None else "–",
            _mde(diff.mde, diff.n),
        )
    return scores


def _mde(detectable: float | None, n: int) -> str:
    """An MDE cell: "–" when undefined, saying so when n is too small for the sign-flip test
    to reach p ≤ 0.05 at all (cts/eval/score/power.py)."""
    if detectable is not None:
        return f"{detectable:.1f}"
    return "–" if can_reject(n, 0.05) else "– (n too small)"


def _pair_tables(
    console: Console, found: PairAgreement, instances: int, floors: list[NoiseFloor]
) -> None:
    keys = found.keys
    console.print(
        f"\n[bold]{escape(found.second)}[/bold] against [bold]{escape(found.first)}[/bold]: "
        f"κ {_kappa(found.kappa)}; strict (full vs rest) κ {_kappa(found.strict_kappa)}",
        highlight=False,
    )
    _movement_lines(console, found, floors)
    console.print(
        f"keys: {keys.paired} paired, {keys.mismatched} mismatched, {keys.failed_both} failed in "
        f"both, judge failed in {keys.judge_failed_first} ({escape(found.first)}) / "
        f"{keys.judge_failed_second} ({escape(found.second)}), {keys.unscored} unscored, "
        f"{keys.only_first} / {keys.only_second} in one run only",
        highlight=False,
    )
    matrix = Table(
        escape(f"{found.first} ↓  {found.second} →"),
        *found.confusion.labels,
        title=f"confusion (n {found.confusion.n} nugget labels)",
    )
    for label, counts in zip(found.confusion.labels, found.confusion.counts, strict=True):
        matrix.add_row(label, *map(str, counts))
    console.print(matrix)
    topics = Table("by", "group", "κ", "strict κ", title="agreement per topic")
    for by, groups in (
        ("language", found.by_language),
        ("removed constraint", found.by_removed_constraint),
    ):
        for group in groups:
            topics.add_row(by, Text(group.group), _kappa(group.kappa), _kappa(group.strict_kappa))
    console.print(topics)
    console.print(_score_table(found))
    if found.by_instance:
        worst = Table(
            "instance",
            "language",
            "agreement",
            "n",
            title=f"lowest agreement ({min(instances, len(found.by_instance))} of "
            f"{len(found.by_instance)} instances)",
        )
        for instance in found.by_instance[:instances]:
            worst.add_row(
                Text(instance.instance_id),
                instance.language,
                _pct(instance.agreement),
                str(instance.n),
            )
        console.print(worst)
    for mismatch in found.mismatches[:10]:
        console.print(f"mismatch {mismatch.key}: {mismatch.why}", style="yellow", markup=False)
    if len(found.mismatches) > 10:
        console.print(f"… {len(found.mismatches) - 10} more mismatches (--out lists all)")


def _print_agreement(console: Console, report: AgreementReport, instances: int) -> None:
    runs = Table("run", "system", "judge", "rejudge of", title="judgements")
    for j in report.judgements:
        runs.add_row(Text(j.name), Text(j.system), Text(j.judge), Text(j.source or ""))
    console.print(runs)
    if len(report.systems) > 1:
        for system in report.systems:
            console.print(
                f"same answers: {', '.join(system.judgements)} ({system.name})",
                highlight=False,
                markup=False,
            )
    for found in report.pairs:
        _pair_tables(console, found, instances, report.floors_for(found))
    if report.rankings:
        ranks = Table(
            "judgement",
            "condition",
            "n systems",
            "instances",
            "Kendall τ-b",
            "order (first → j-th)",
            title="does the judge change the systems' ranking?",
        )
        for change in report.rankings:

            def order(scores: list[float], systems: list[str] = change.systems) -> str:
                ranked = sorted(zip(scores, systems, strict=True), key=lambda x: -x[0])
                return " > ".join(name for _, name in ranked)

            tau = change.tau.tau
            ranks.add_row(
                f"1 vs {change.judgement + 1}",
                change.condition,
                str(change.tau.n),
                str(change.instances),
                "undefined" if tau is None else f"{tau:.2f}",
                Text(f"{order(change.first)}  →  {order(change.second)}"),
            )
        console.print(ranks)
    for note in report.notes:
        console.print(f"note: {note}", style="yellow", markup=False, highlight=False)


@command(app, "agreement")
def agreement_command(
    runs: list[Path] = typer.Argument(
        ...,
        help="Two or more run directories judging the same answers (a run and its `cts "
        "rejudge`), or such pairs for several systems.",
    ),
    out: Path | None = typer.Option(None, help="Also write every figure as JSON here."),
    instances: int = typer.Option(10, help="List this many lowest-agreement instances."),
    resamples: int = typer.Option(10_000, help="Bootstrap resamples of the score differences."),
) -> None:
    """How far judgements of the same answers agree.

    Runs judging the same answers (a rejudge and its source, or runs whose answers are equal
    on every key both judged) are compared pairwise, the first given as the reference: Cohen's
    κ over the nugget labels (full/partial/none, and strict full vs rest) with the confusion
    matrix, κ per language and per removed constraint, agreement per instance, the restore
    score's difference per condition with a paired bootstrap CI, and how many labels and score
    points move (CIs over instances). Two runs by the same judge (model config, sampling,
    judge: options, the judge's prompt) give that judge's noise floor, shown beside every
    comparison of it with another judge, unless one run's labels are all response-cache
    replays (a note says so). Each run is given once. Labels are paired on
    (instance, condition, seed, nugget); keys with other answers or nuggets are listed, not
    joined. With several systems each judged twice or more (give each system's runs in the
    same judge order), Kendall's τ-b says whether the systems' ranking per condition changes.
    Exit 1 when no two runs judge the same answers."""
    if len(runs) < 2:
        raise usage_error("give at least two run directories")
    seen: dict[Path, Path] = {}
    for run in runs:
        # One run given twice would be compared with itself: identical labels, no reading.
        if run.resolve() in seen:
            earlier = seen[run.resolve()]
            raise usage_error(f"{earlier} and {run} are the same run directory: give each once")
        seen[run.resolve()] = run
    judgements = [read_judgement(p, n) for p, n in zip(runs, names_for(runs), strict=True)]
    report = agreement(judgements, resamples=resamples)
    console = output_console()
    _print_agreement(console, report, instances)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(asdict(report), indent=1, ensure_ascii=False) + "\n")
        console.print(f"figures: {out}", highlight=False)
    if not report.pairs:
        typer.echo("no two runs given judge the same answers: nothing compared", err=True)
        raise typer.Exit(1)


@command(app, "export")
def export_command(
    run_dir: Path = typer.Argument(..., help="A run directory whose records were judged."),
    to: Format = typer.Option(..., help="The format to write."),
    out: Path = typer.Option(..., help="The assignments JSONL to write."),
    condition: list[str] = typer.Option(
        [], help="Only this condition's records (repeatable; default: all)."
    ),
    run_id: str | None = typer.Option(
        None, help="run_id prefix (default: the run directory's name)."
    ),
    weight_map: str = WEIGHT_MAP_OPTION,
    vital_from: float | None = VITAL_FROM_OPTION,
    dataset: str | None = typer.Option(
        None,
        help="Read the run's dataset from here (when its config's path no longer reaches it); "
        "it must be the dataset the run ran on (its fingerprint).",
    ),
) -> None:
    """Write a run's judge labels as nuggetizer's answer assignments
    (https://github.com/castorini/nuggetizer, its README's `assign --input-kind answers`
    output): one line per judged record, {query, qid, answer_text, response_length, run_id,
    nuggets: [{text, importance, assignment}]}, with full → support, partial →
    partial_support, none → not_support, query the fused query, run_id RUN.CONDITION.seedS,
    importance by --vital-from (default weight 3 → vital, others okay). Records without labels
    (failed, or the judge failed) are counted, not written. `nuggetizer metrics` averages
    every line of a file: export one condition per file (--condition) to read its global
    figures per condition. Exit 1 when no record was judged; 2 for bad input."""
    weights = parse_weight_map(weight_map, vital_from)
    export = export_assignments(run_dir, out, weights, condition, run_id, dataset)
    for why, n in sorted(export.skipped.items()):
        typer.echo(f"left out: {n} record(s) {why}")
    if not export.written:
        typer.echo(f"no judged record in {run_dir}: nothing written", err=True)
        raise typer.Exit(1)
    typer.echo(
        f"{export.written} judged answer(s) written as {to.value} assignments → {out} "
        f"(run_ids: {', '.join(export.run_ids)}; {weights.describe()})"
    )
