"""The report of one or more runs: summary.json for machines, report.md and a self-contained
report.html (figures embedded) for people, and the figures as PNG.

One row per clarifier system (a run directory) in the paper-style main table: blurred,
clarify@1..3 and oracle with 95% bootstrap CIs, each cell with the instances it stands on and
the condition's failed records. Every number is paired: it stands on the instances scored under
every condition of every run in the report (see cts/eval/report/diagnostics.py); the others are
listed in summary.json with why. Several runs are also compared pairwise per condition. Blurred and
oracle do not depend on the clarifier; with the shared response cache, comparing clarifiers
re-uses them (the report says so).

This module loads the runs, checks that they are complete and comparable, computes the summary
and writes the report's files; what they say is apart: the Markdown (markdown.py), its warnings
(warnings.py), the figures (figures.py) and the HTML page (html.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cts.eval.data.dataset import load_instances
from cts.eval.data.readers import DatasetError
from cts.eval.data.schema import Instance, Record
from cts.eval.report.comparability import Unlike, refusal, setup_of, unlike_pairs
from cts.eval.report.diagnostics import (
    FailurePolicy,
    Scored,
    compare_systems,
    paired_instances,
    score_records,
    summarize,
)
from cts.eval.report.figures import figures
from cts.eval.report.html import to_html
from cts.eval.report.markdown import MAIN_COLUMNS, markdown
from cts.eval.report.summary import Comparison, ReportInfo, Summary, SystemSummary
from cts.eval.run.bulk import collector_paused
from cts.eval.run.config import ExperimentConfig
from cts.eval.run.fingerprint import CODE_KEY, results_digest
from cts.eval.run.oracle import oracle_independence
from cts.eval.run.records import MergeReport, RecordStore, merge
from cts.eval.run.run_dir import RunDir
from cts.eval.run.scope import in_scope
from cts.foundation.disk import write_whole
from cts.foundation.yaml_config import read_yaml


@dataclass
class RunView:
    """What the report reads of a run directory."""

    name: str
    experiment: ExperimentConfig
    records: list[Record]
    #: Whether its oracle is golden construction again (cts/eval/run/oracle.py).
    oracle: dict[str, Any] | None = None
    #: Everything but the clarifier its records depend on (cts/eval/report/comparability.py).
    setup: dict[str, Any] = field(default_factory=dict)
    #: Stored records config.yaml no longer names (cts/eval/run/scope.py), counted by why.
    ignored: dict[str, Any] = field(default_factory=dict)
    #: The instances config.yaml names (None: its dataset did not load), with a record or not.
    instance_ids: list[str] | None = None


def load_run(run_dir: Path) -> RunView:
    """A run as its config.yaml names it: the records of its instances, conditions and seeds
    (those a narrowing resume left outside are counted in `ignored`)."""
    run = RunDir(run_dir)
    resolved = run.read_config()
    experiment = resolved.experiment
    dataset = experiment.dataset
    everything: list[Instance] | None
    try:
        everything = load_instances(dataset.model_copy(update={"limit": None}))
    except DatasetError:
        everything = None
    instances = everything[: dataset.limit] if everything and dataset.limit else everything
    scoped = in_scope(
        RecordStore(run_dir).completed().values(),
        experiment.conditions,
        experiment.seeds,
        None if everything is None else [i.id for i in everything[len(instances or ()) :]],
    )
    oracle = oracle_independence(resolved, instances)
    prints, answers = answers_of(run)
    setup = setup_of(resolved, prints, everything, answers)
    return RunView(
        resolved.system_name(),
        experiment,
        scoped.records,
        oracle,
        setup,
        scoped.as_dict(),
        None if instances is None else [i.id for i in instances],
    )


def answers_of(run: RunDir) -> tuple[dict[str, str], dict[str, Any]]:
    """A run's fingerprint as its records were made, and where its final answers come from
    (`{of, rejudge}`: the digest of what the records of the run that made them depend on —
    for a rejudge, its source's); the code that made a rejudge's answers is its source's, all
    but the judge's (`code:judge`)."""
    prints = run.read_fingerprint()
    document, _ = read_yaml(run.config)
    try:
        source = json.loads(run.provenance.read_text("utf-8"))["source"]
        made = source.get("fingerprint") or {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return prints, {"of": results_digest(document), "rejudge": False}
    code = {k: v for k, v in made.items() if k.startswith(CODE_KEY) and k != f"{CODE_KEY}judge"}
    ours = {k: v for k, v in prints.items() if not k.startswith(CODE_KEY) or k.endswith("judge")}
    of = made.get("source") or source.get("config_digest") or prints.get("source", "")
    return {**ours, **code}, {"of": str(of), "rejudge": True}


@dataclass
class Completeness:
    """Whether a run holds every key of its config exactly once (what `cts merge` checks)."""

    run_dir: Path
    merged: MergeReport | None
    #: Why completeness could not be checked (its dataset no longer loads).
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.merged is not None and self.merged.ok

    def describe(self) -> str:
        if self.merged is None:
            return f"{self.run_dir}: completeness not checked: {self.error}"
        return (
            f"{self.run_dir}: {len(self.merged.missing)} missing, "
            f"{len(self.merged.duplicates)} duplicated keys (of its config's instances × "
            "conditions × seeds; `cts merge` refuses it)"
        )


def check_complete(run_dir: Path) -> Completeness:
    """The `merge` check of one run against its config, read-only: nothing is written."""
    experiment = RunDir(run_dir).read_config().experiment
    try:
        instances = load_instances(experiment.dataset)
    except DatasetError as e:
        return Completeness(run_dir, None, f"dataset error: {e}")
    store = RecordStore(run_dir)
    return Completeness(run_dir, merge(store, instances, experiment.conditions, experiment.seeds))


@dataclass
class _Computed:
    """What a report's files are written from."""

    runs: list[RunView]
    policy: FailurePolicy
    min_gap: float
    ids: list[str]
    systems: list[tuple[str, dict[str, Any]]]
    comparisons: list[dict[str, Any]]
    #: Pairs of runs that differ beyond the clarifier (shown only with `allow_unlike`).
    unlike: list[Unlike] = field(default_factory=list)


def _like_for_like(runs: list[RunView], run_dirs: list[Path], allow_unlike: bool) -> list[Unlike]:
    """The pairs of runs that differ beyond the clarifier: IncomparableRuns naming them and
    what differs, unless `allow_unlike` (then each such comparison row carries a warning)."""
    unlike = unlike_pairs([(run.name, run.setup) for run in runs])
    if unlike and not allow_unlike:
        raise refusal(unlike, [str(d) for d in run_dirs])
    return unlike


def _mark_unlike(comparisons: list[dict[str, Any]], unlike: list[Unlike]) -> None:
    """Each comparison row of an unlike pair gets what differs (`unlike`), {} otherwise."""
    by_pair = {(u.first, u.second): u.differences for u in unlike}
    for row in comparisons:
        row["unlike"] = by_pair.get((row["a"], row["b"]), [])


def _compute(
    run_dirs: list[Path],
    failures: FailurePolicy | None,
    min_gap: float | None,
    allow_unlike: bool = False,
) -> _Computed:
    runs = [load_run(d) for d in run_dirs]
    names = [r.name for r in runs]
    folders = [d.name for d in run_dirs]
    for run, run_dir in zip(runs, run_dirs, strict=True):
        if names.count(run.name) > 1:  # same experiment and clarifier: tell them apart
            where = run_dir.name if folders.count(run_dir.name) == 1 else str(run_dir)
            run.name = f"{run.name} [{where}]"
    unlike = _like_for_like(runs, run_dirs, allow_unlike)
    settings = runs[0].experiment.report
    policy: FailurePolicy = failures or settings.failures
    gap = settings.min_gap if min_gap is None else min_gap
    scored: list[Scored] = [
        score_records(
            r.records,
            list(r.experiment.conditions),
            r.experiment.seeds,
            policy,
            r.instance_ids or (),
        )
        for r in runs
    ]
    ids = paired_instances(
        [(s, list(r.experiment.conditions)) for s, r in zip(scored, runs, strict=True)]
    )
    systems = [
        (
            run.name,
            summarize(
                run.records,
                list(run.experiment.conditions),
                run.experiment.seeds,
                ids,
                s,
                policy=policy,
                min_gap=gap,
                mode=run.experiment.clarification.mode,
                canary_warn=run.experiment.judge.canary.warn_rate,
            ),
        )
        for run, s in zip(runs, scored, strict=True)
    ]
    for run, (_, summary) in zip(runs, systems, strict=True):
        summary["oracle_independence"] = run.oracle
        summary["ignored_records"] = run.ignored
    conditions = [c for c in MAIN_COLUMNS if any(c in r.experiment.conditions for r in runs)]
    comparisons = compare_systems(
        [(run.name, s) for run, s in zip(runs, scored, strict=True)], conditions
    )
    _mark_unlike(comparisons, unlike)
    return _Computed(runs, policy, gap, ids, systems, comparisons, unlike)


@dataclass(frozen=True)
class Report:
    """What `write_report` wrote: the typed summary and where each file is."""

    summary: Summary
    summary_json: Path
    markdown: Path
    html: Path
    figures: Path


def write_report(
    run_dirs: list[Path],
    out: Path,
    failures: FailurePolicy | None = None,
    min_gap: float | None = None,
    allow_unlike: bool = False,
) -> Report:
    """The report of `run_dirs` (one per clarifier system) into `out`. The failure policy and
    gain recovered's minimum gap default to the first run's `report:` config. Runs that differ
    beyond the clarifier are refused (IncomparableRuns, nothing written) unless
    `allow_unlike`, which shows them with a warning on every comparison row."""
    # Tens of thousands of acyclic records and the tables built from them: see cts/eval/run/bulk.py.
    with collector_paused():
        found = _compute(run_dirs, failures, min_gap, allow_unlike)
    runs, ids, systems, comparisons = found.runs, found.ids, found.systems, found.comparisons
    policy, gap = found.policy, found.min_gap
    files = RunDir(out)  # a combined report is laid out like a run's own
    summary = Summary(
        report=ReportInfo(
            runs=[str(d) for d in run_dirs],
            failure_policy=policy,
            min_gap=gap,
            paired_instances=len(ids),
            unlike=[u.as_dict() for u in found.unlike],
        ),
        systems={name: SystemSummary(**system) for name, system in systems},
        comparisons=[Comparison(**row) for row in comparisons],
    )
    summary.write(files.summary)
    text = markdown(systems, comparisons, len(ids), policy)
    write_whole(files.report_md, text)
    images = figures(systems, files.figures)
    viewable = [(run.name, d.resolve()) for run, d in zip(runs, run_dirs, strict=True)]
    write_whole(files.report_html, to_html(text, images, viewable))
    return Report(summary, files.summary, files.report_md, files.report_html, files.figures)
