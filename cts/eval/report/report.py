"""The report of one or more runs: summary.json for machines, report.md and a self-contained
report.html (figures embedded) for people, and the figures as PNG.

One row per clarifier system (a run directory) in the paper-style main table: blurred,
clarify@1..3 and oracle with 95% bootstrap CIs, each cell with the instances it stands on and
the condition's failed records. Every number is paired: it stands on the instances scored under
every condition of every run in the report (see cts/eval/report/diagnostics.py); the others are
listed in summary.json with why. Several runs are also compared pairwise per condition. Blurred and
oracle do not depend on the clarifier; with the shared response cache, comparing clarifiers
re-uses them (the report says so).
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cts.eval.data.dataset import DatasetError, load_instances
from cts.eval.data.schema import Instance, Record
from cts.eval.report.comparability import Unlike, parts, refusal, setup_of, unlike_pairs
from cts.eval.report.diagnostics import (
    ALPHA,
    DEGENERATE_SHARE,
    QUESTION_TYPES,
    FailurePolicy,
    Scored,
    compare_systems,
    excluded_for_failures,
    paired_instances,
    score_records,
    summarize,
)
from cts.eval.report.summary import Comparison, ReportInfo, Summary, SystemSummary
from cts.eval.run.bulk import collector_paused
from cts.eval.run.config import ALL_CONDITIONS, ExperimentConfig
from cts.eval.run.fingerprint import CODE_KEY, results_digest
from cts.eval.run.oracle import oracle_independence, oracle_warning
from cts.eval.run.run_dir import RunDir
from cts.eval.run.runner import MergeReport, RecordStore, merge
from cts.eval.run.scope import ignored_note, in_scope
from cts.eval.score.power import can_reject
from cts.serving.disk import write_whole
from cts.serving.yaml_config import read_yaml

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MAIN_COLUMNS: list[str] = list(ALL_CONDITIONS)


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


def report_cell(entry: dict[str, Any] | None, policy: str) -> str:
    if not entry:
        return "–"
    failed = entry.get("failed", 0)
    note = f", {failed} failed" + (" (scored 0)" if policy == "zero" else "") if failed else ""
    if "restore_score_100" not in entry:
        return f"– (n=0{note})"
    s = entry["restore_score_100"]
    return f"{s['mean']:.1f} [{s['low']:.1f}, {s['high']:.1f}] (n={s['n']}{note})"


def _pct(value: dict[str, Any] | float | None) -> str:
    """A rate as a percentage; a {rate, n} entry with its n."""
    if isinstance(value, dict):
        rate, n = value.get("rate"), value.get("n")
        return "–" if rate is None else f"{100 * rate:.0f}% of {n}"
    return "–" if value is None else f"{100 * value:.0f}%"


def _score(entry: dict[str, Any]) -> str:
    return "–" if entry["mean"] is None else f"{entry['mean']:.1f} ({entry['records']} records)"


def _recovered(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "–"
    if entry.get("undefined"):
        return f"undefined (gap {entry['gap']:.1f} < {entry['min_gap']:g})"
    if entry["low"] is None:
        return f"{entry['value']:.2f} [CI undefined: gap not reliably > 0]"
    return f"{entry['value']:.2f} [{entry['low']:.2f}, {entry['high']:.2f}]"


def warnings(name: str, summary: dict[str, Any]) -> list[str]:
    """Lines a reader must not miss: failed records, a judge that gives one label."""
    found = []
    f = summary["failures"]
    if f["total"]:
        by_stage = ", ".join(f"{k} {v}" for k, v in sorted(f["by_stage"].items()))
        by_kind = ", ".join(f"{k} {v}" for k, v in sorted(f["by_kind"].items()))
        treated = (
            "scored 0"
            if summary["failure_policy"] == "zero"
            else f"their instances are left out of the paired tables ({_excluded(summary)})"
        )
        found.append(
            f"WARNING {name}: {f['total']} of {summary['records']} records failed "
            f"(by stage: {by_stage}; by kind: {by_kind}); {treated}."
        )
    tools = f.get("tool_errors", {"total": 0})  # summaries written before it was counted
    if tools["total"]:
        found.append(
            f"WARNING {name}: {tools['total']} searches or visits failed inside the search runs "
            f"of {tools['records']} of {summary['records']} records (the agent read an error "
            "observation; see the traces' tool steps)."
        )
    mixed = summary["clarification"]["dialogue_mismatches"]
    if mixed:
        found.append(
            f"WARNING {name}: for {mixed} (instance, seed) the clarify@j questions are not the "
            "first j of clarify@k: records of different dialogues are mixed (a run resumed "
            "with another clarifier?); clarify@k does not extend clarify@(k−1) there."
        )
    oracle = oracle_warning(name, summary.get("oracle_independence"))
    if oracle:
        found.append(oracle)
    ignored = ignored_note(name, summary.get("ignored_records"))
    if ignored:
        found.append(ignored)
    judge = summary["judge"]
    if judge["degenerate"]:
        found.append(
            f"WARNING {name}: the judge labelled {100 * judge['dominant_share']:.0f}% of "
            f"{judge['total']} nuggets `{judge['dominant']}` (≥ {100 * DEGENERATE_SHARE:.0f}%): "
            "it does not tell answers apart, so these scores are uninformative."
        )
    return found + judge_warnings(name, judge)


def _excluded(summary: dict[str, Any]) -> str:
    """How many instances the failures left out; the total apart when other causes (a missing
    record, no score in another run) left out more, lest all be blamed on the failures."""
    excluded = summary["excluded_instances"]
    failed = excluded_for_failures(excluded)
    text = f"{failed} instance{'s' if failed != 1 else ''} excluded for a failed record"
    if len(excluded) > failed:
        text += f"; {len(excluded)} excluded in all, the others' why in `excluded_instances`"
    return text


def judge_warnings(name: str, judge: dict[str, Any]) -> list[str]:
    """A language or condition whose labels one label dominates, and a canary that got credit
    from an answer stating no nugget."""
    found = []
    for by, title in (("by_language", "language"), ("by_condition", "condition")):
        flagged = [
            f"{group} ({100 * g['dominant_share']:.0f}% `{g['dominant']}` of {g['total']})"
            for group, g in judge.get(by, {}).items()
            if g["degenerate"]
        ]
        if flagged:
            found.append(
                f"WARNING {name}: per {title}, the judge gave one label to ≥ "
                f"{100 * DEGENERATE_SHARE:.0f}% of the nuggets of {', '.join(flagged)}: there it "
                "does not tell answers apart, or every answer was alike; a difference between "
                "these groups may be the judge's, not the answers' (see the canary)."
            )
    canary = judge.get("canary") or {}
    for kind, c in (canary.get("by_answer") or {}).items():
        if c.get("warn"):
            found.append(_canary_warning(name, kind, c, canary))
    return found


#: What credit against each canary answer says about the judge.
_CANARY_MEANS = {
    "restated": "it credits an answer that only restates the question (a restatement bias), "
    "so a clarifier or rewriter could gain by echoing constraints instead of finding facts",
}


def _canary_warning(name: str, kind: str, c: dict[str, Any], canary: dict[str, Any]) -> str:
    """The warning of one canary answer whose credited share reached `warn_rate`."""
    means = _CANARY_MEANS.get(
        kind,
        "it credits nuggets without reading the answer, so these scores do not measure the answers",
    )
    return (
        f"WARNING {name}: answer-independence canary ({kind} answer): judging nuggets against "
        f"an answer that states none of them, the judge gave {c['full'] + c['partial']} of "
        f"{c['labels']} labels full or partial ({100 * c['rate']:.0f}%, warned from "
        f"{100 * canary['warn_rate']:.0f}%: {c['full']} full, {c['partial']} partial; "
        f"{canary['records']} records of {canary['instances']} instances sampled): {means}."
    )


def markdown(
    systems: list[tuple[str, dict[str, Any]]],
    comparisons: list[dict[str, Any]],
    paired: int,
    policy: str,
) -> str:
    lines = _preamble(paired, policy)
    for name, summary in systems:
        lines += [f"- {w}" for w in warnings(name, summary)]
    unlike = {(c["a"], c["b"]): c["unlike"] for c in comparisons if c.get("unlike")}
    lines += [
        f"- WARNING {a} vs {b}: compared although they differ beyond the clarifier, in "
        f"{', '.join(parts(differ))} (see Systems compared): their rows are not like for like."
        for (a, b), differ in unlike.items()
    ]
    lines += _main_table(systems, policy)
    lines += _clarification_modes(systems)
    lines += _cache_reuse(systems)
    if comparisons:
        lines += _comparisons_section(comparisons)
    for name, summary in systems:
        lines += _system_section(name, summary)
    return "\n".join(lines)


def _preamble(paired: int, policy: str) -> list[str]:
    """The title and how to read every number below: the score, its CI and n, the pairing."""
    treated = (
        "failed records score 0 (policy `zero`)"
        if policy == "zero"
        else "instances with a failed record are excluded (policy `exclude`)"
    )
    return [
        "# Clarify-Then-Search report",
        "",
        "restore_score_100 (weighted nugget coverage, 0–100): mean over instances (each the "
        "mean over seeds) with a 95% bootstrap CI; n = instances, then how many instances "
        "had a failed record under the condition.",
        "",
        f"Paired: the main table, the gains and the breakdowns stand on the {paired} "
        f"instance(s) scored under every condition of every run below; {treated}. Excluded "
        "instances are listed, with why, in summary.json (`excluded_instances`). Systems are "
        "compared per condition on the instances both scored; the clarification diagnostics "
        "are rates over the clarify@k records that did not fail, each with its n.",
        "",
    ]


def _cell(text: object) -> str:
    """Text as one Markdown table cell: a `|` in it (an experiment named `a|b`) would end the
    cell, and a line break the row. `\\` and `|` are escaped; `_row_cells` reads them back."""
    flat = re.sub(r"[\r\n]+", " ", str(text))
    return flat.replace("\\", "\\\\").replace("|", "\\|")


def _row_cells(line: str) -> list[str]:
    """The cells of a Markdown table row, `\\|` and `\\\\` read as `|` and `\\`."""
    cells, cell, escaped = [], [], False
    for char in line.strip()[1:]:
        if escaped:
            cell.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "|":
            cells.append("".join(cell).strip())
            cell = []
        else:
            cell.append(char)
    return cells


def _main_table(systems: list[tuple[str, dict[str, Any]]], policy: str) -> list[str]:
    """The paper-style table: one row per system, one column per main condition."""
    lines = [
        "",
        "| system | " + " | ".join(MAIN_COLUMNS) + " |",
        "|---|" + "---|" * len(MAIN_COLUMNS),
    ]
    for name, summary in systems:
        cells = [report_cell(summary["scores"].get(c), policy) for c in MAIN_COLUMNS]
        lines.append(f"| {_cell(name)} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def _clarification_modes(systems: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """How each system asks its k questions: what clarify@k means there."""
    lines = []
    for name, summary in systems:
        mode = summary["clarification"]["mode"]
        how = (
            "clarify@j is the first j turns of one dialogue per instance and seed"
            if mode == "sequential"
            else "each clarify@k asks its k questions in one call"
        )
        lines.append(f"- {name}: clarification `{mode}` ({how}).")
    return lines


def _cache_reuse(systems: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The blurred and oracle searches each system took from the shared response cache."""
    lines = [
        "",
        "Blurred and oracle searches do not depend on the clarifier; runs that share "
        "the response cache re-use them instead of recomputing:",
        "",
    ]
    for name, summary in systems:
        reused = [
            f"{c} {u['cached']} of {u['search_llm_calls']}"
            for c, u in summary["reuse"].items()
            if c in ("blurred", "oracle")
        ]
        if reused:
            lines.append(f"- {name}: search-agent model calls from the cache: {', '.join(reused)}.")
    lines.append("")
    return lines


def _comparisons_section(comparisons: list[dict[str, Any]]) -> list[str]:
    """The systems compared pairwise, per condition; a pair that differs beyond the clarifier
    (shown only on request) is warned about above the table and on each of its rows."""
    pairs = {(c["a"], c["b"]): c["unlike"] for c in comparisons if c.get("unlike")}
    lines = [
        "## Systems compared",
        "",
        "Per condition, on the instances both systems scored under it: difference in "
        "restore_score_100 (first − second) with a paired bootstrap 95% CI and a paired "
        "sign-flip test; p (Holm) corrects across the clarify@k conditions of each pair. MDE: "
        "the smallest true difference the test detects with 80% power (at α/m on the Holm "
        "rows, m of them a pair).",
        "",
    ]
    for (a, b), differ in pairs.items():
        lines.append(
            f"- WARNING {a} vs {b}: not like for like: they differ beyond the clarifier "
            f"({'; '.join(differ)}), so their difference is not the clarifier's."
        )
    if pairs:
        lines.append("")
    warned = " warning |" if pairs else ""
    lines += [
        "| first − second | condition | difference [95% CI] | p | p (Holm) | MDE | n |" + warned,
        "|---|---|---|---|---|---|---|" + ("---|" if pairs else ""),
    ]
    family = Counter((c["a"], c["b"]) for c in comparisons if c["p_holm"] is not None)
    for c in comparisons:
        holm_p = "–" if c["p_holm"] is None else f"{c['p_holm']:.3f}"
        # The level its MDE is at (diagnostics.compare_systems): α/m on a Holm row.
        alpha = ALPHA if c["p_holm"] is None else ALPHA / family[(c["a"], c["b"])]
        detectable = _mde_cell(c.get("mde"), c["n"], alpha)
        differ = c.get("unlike") or []
        if pairs:
            warned = f" WARNING: differs in {', '.join(parts(differ))} |" if differ else " – |"
        lines.append(
            f"| {_cell(c['a'])} − {_cell(c['b'])} | {c['condition']} | {c['difference']:+.1f} "
            f"[{c['low']:+.1f}, {c['high']:+.1f}] | {c['p_value']:.3f} | {holm_p} | "
            f"{detectable} | {c['n']} |" + warned
        )
    lines.append("")
    return lines


def _mde_cell(detectable: float | None, n: int, alpha: float) -> str:
    """An MDE as the tables print it; undefined, with why when n is too small for the sign-flip
    test to reach p ≤ alpha at all (cts/eval/score/power.py)."""
    if detectable is not None:
        return f"{detectable:.1f}"
    return "–" if can_reject(n, alpha) else "– (n too small: p ≥ 2/2ⁿ)"


def _system_section(name: str, summary: dict[str, Any]) -> list[str]:
    """One system's own section: its counts, gains, User Answerer, question types,
    breakdowns, judge and failures."""
    return [
        *_system_header(name, summary),
        *_gains_table(summary),
        *_answerer_table(summary),
        *_question_types_table(summary),
        *_breakdown_tables(summary),
        *_unsupported_answers(summary),
        *_judge_and_failures(summary),
    ]


def _system_header(name: str, summary: dict[str, Any]) -> list[str]:
    """The system's heading, its counts and the study's region figure."""
    return [
        f"## {name}",
        "",
        f"{summary['instances']} instances ({summary['paired_instances']} paired, "
        f"{len(summary['excluded_instances'])} excluded), seeds {summary['seeds']}, "
        f"{summary['records']} records.",
        "",
        *_region_lines(summary["clarification"]),
        "",
    ]


def _region_lines(c: dict[str, Any]) -> list[str]:
    """The study's region figure (region-only questions) and, named apart, the any-region
    rate and the all-region dialogues."""
    only, anyr = c["region_only_unknown_rate"], c["any_region_unknown_rate"]

    def rate(entry: dict[str, Any], what: str) -> str:
        if not entry["n"]:
            return f"no {what} asked"
        return f"{_pct(entry['rate'])} ({entry['unknown']} unknown of {entry['n']} {what})"

    return [
        f"- **Unknown rate of region-only questions** (the study's region figure): "
        f"{rate(only, 'questions whose only type is region')}; the study: {only['study']}.",
        f"- Unknown rate of any-region questions: "
        f"{rate(anyr, 'questions with region among their types')}.",
        f"- Dialogues in which every question asked about region: "
        f"{_pct(c['all_region_interaction_rate'])} dialogues (not an unknown rate).",
    ]


def _gains_table(summary: dict[str, Any]) -> list[str]:
    """Per condition: strict and unweighted scores, the gain over blurred, the gain recovered."""
    lines = [
        "Gain over blurred: paired mean difference [95% CI], sign-flip p. Gain recovered: "
        "(score − blurred) / (oracle − blurred) [paired bootstrap 95% CI], undefined when the "
        "oracle's gap over blurred is below the minimum.",
        "",
        "MDE: the smallest true gain the test detects with 80% power at α = 0.05 on these "
        'instances and seeds: read "no significant gain" against it.',
        "",
        "| condition | strict | unweighted | gain over blurred [CI], p | MDE | gain recovered "
        "| n |",
        "|---|---|---|---|---|---|---|",
    ]
    for condition, entry in summary["scores"].items():
        strict = entry.get("strict", {}).get("mean")
        unweighted = entry.get("unweighted", {}).get("mean")
        gain = summary["gains"].get(condition)
        gain_text = (
            f"{gain['gain_over_blurred']:+.1f} [{gain['low']:+.1f}, {gain['high']:+.1f}], "
            f"p={gain['p_value']:.3f}"
            if gain
            else "–"
        )
        detectable = _mde_cell(gain.get("mde"), gain["n"], ALPHA) if gain else "–"
        lines.append(
            f"| {condition} | {'–' if strict is None else f'{strict:.1f}'} | "
            f"{'–' if unweighted is None else f'{unweighted:.1f}'} | {gain_text} | "
            f"{detectable} | "
            f"{_recovered(gain.get('gain_recovered') if gain else None)} | {entry['n']} |"
        )
    return [*lines, "", *_variance_table(summary)]


def _sd(variance: float | None, low: float | None, high: float | None) -> str:
    """A variance as an sd, with its interval's square roots: the square root is monotone, so
    the resampled variances' percentiles give the sds' (up to the interpolation between two
    resamples)."""
    if variance is None:
        return "– (one seed)"
    text = f"{variance**0.5:.1f}"
    return text if low is None or high is None else f"{text} [{low**0.5:.1f}, {high**0.5:.1f}]"


def _variance_table(summary: dict[str, Any]) -> list[str]:
    """Where the noise comes from: per condition, instances against seeds."""
    variance = summary.get("variance") or {}
    if not variance:
        return []
    lines = [
        "Where the noise comes from: restore scores' variance between instances and within an "
        "instance across seeds (one-way random effects), as sds; noise from seeds = within / "
        "(between + within); each [bootstrap 95% CI over the n instances]. High: more seeds "
        "narrow the intervals; low: only more instances do.",
        "",
        "| condition | sd between instances | sd within (seeds) | noise from seeds | n, seeds |",
        "|---|---|---|---|---|",
    ]
    for condition, c in variance.items():
        between = _sd(c["between"], c.get("between_low"), c.get("between_high"))
        if c["within"] is None:  # one seed: nothing to tell a seed's noise from an instance's
            between += " (includes seed noise: one seed)"
        within = _sd(c["within"], c.get("within_low"), c.get("within_high"))
        share = "–" if c["seed_share"] is None else _pct(c["seed_share"])
        if c.get("seed_share_low") is not None:
            share += f" [{_pct(c['seed_share_low'])}, {_pct(c['seed_share_high'])}]"
        lines.append(
            f"| {condition} | {between} | {within} | {share} | {c['instances']}, {c['seeds']:g} |"
        )
    return [*lines, ""]


def _answerer_table(summary: dict[str, Any]) -> list[str]:
    """The User Answerer per k, in two tables narrow enough to print at A4: what the answers
    gave away, then what they led to (all-unknown and stopped-early rates, the score with some
    answer against with none)."""
    c = summary["clarification"]
    answered = summary["score_by_answered"]
    lines = [
        "",
        "User Answerer, per k (rates of the clarify@k records that did not fail): "
        "answerability (answers not `unknown`), per turn within k; over-answer rate (of the "
        "answers not `unknown`, those revealing two or more pieces of the fused query's "
        "missing information) and those holding most (over half) of the fused query.",
        "",
        "| k | answerability | per turn | over-answer | most of fused query |",
        "|---|---|---|---|---|",
    ]
    over, most = c["over_answer_rate_per_k"], c["most_of_fused_rate_per_k"]
    for k, value in c["answerability_per_k"].items():
        turns = "; ".join(f"t{t}: {_pct(v)}" for t, v in c["answerability_per_turn"][k].items())
        lines.append(
            f"| {k} | {_pct(value)} | {turns} | {_pct(over.get(k))} | {_pct(most.get(k))} |"
        )
    lines += [
        "",
        "What the answers led to, per k: the all-unknown rate, the stopped-early rate, and the "
        "score when some answer was given against when all were `unknown`.",
        "",
        "| k | all-unknown rate | stopped early | score, some answered | score, all unknown |",
        "|---|---|---|---|---|",
    ]
    for k in c["answerability_per_k"]:
        split = answered.get(k, {})
        lines.append(
            f"| {k} | {_pct(c['all_unknown_rate_per_k'][k])} | "
            f"{_pct(c['stopped_early_rate_per_k'][k])} | "
            f"{_score(split['some_answered']) if split else '–'} | "
            f"{_score(split['all_unknown']) if split else '–'} |"
        )
    return [*lines, *_over_answer_note(c)]


def _over_answer_note(c: dict[str, Any]) -> list[str]:
    """How the over-answer rate's pieces were found, and the answers it could not measure."""
    basis, skipped = c["over_answer_basis"], c["over_answer_unmeasured"]
    if not basis and not skipped:
        return []
    how = {
        "spans": "the instance's removed spans",
        "one_constraint": "one removed constraint (all missing words one piece)",
        "runs": "runs of missing words (a proxy; a lower bound)",
    }
    found = "; ".join(f"{how[b]}: {n} answers" for b, n in basis.items())
    return [
        "",
        f"Over-answer pieces found by {found or 'nothing'}"
        + (f"; {skipped} answers of older records not measured" if skipped else "")
        + " (docs/reading-the-report.md).",
    ]


def _question_types_table(summary: dict[str, Any]) -> list[str]:
    """The clarifier's question-type mix and the unknown rate of each type."""
    c = summary["clarification"]
    lines = [
        "",
        f"Question types of the {c['questions']} questions asked (a question may have several "
        "types, so shares may add up to more than 100%):",
        "",
        "| question type | questions | share | unknown rate |",
        "|---|---|---|---|",
    ]
    for t in QUESTION_TYPES:
        lines.append(
            f"| {t} | {c['question_type_counts'][t]} | {_pct(c['question_type_share'][t])} | "
            f"{_pct(c['unknown_rate_per_type'][t]['rate'])} |"
        )
    return lines


def _breakdown_tables(summary: dict[str, Any]) -> list[str]:
    """Scores per condition by language and by removed constraint (each left out if empty)."""
    lines: list[str] = []
    for by, title in (("language", "language"), ("removed_constraint", "removed constraint")):
        groups = summary["breakdowns"][by]
        if not groups:
            continue
        conditions = list(summary["scores"])
        lines += [
            "",
            f"| {title} | n | " + " | ".join(conditions) + " |",
            "|---|---|" + "---|" * len(conditions),
        ]
        for group, entry in groups.items():
            lines.append(
                f"| {_cell(group)} | {entry['n']} | "
                + " | ".join(f"{entry[cond]:.1f}" for cond in conditions)
                + " |"
            )
    return lines


def _unsupported_answers(summary: dict[str, Any]) -> list[str]:
    """The share of abstractive answers not supported by the fused query, if any were checked."""
    c = summary["clarification"]
    if not c["unsupported_answers"]["checked"]:
        return []
    return [
        "",
        f"Abstractive answers with content words not in the fused query: "
        f"{_pct(c['unsupported_answers']['rate'])} of "
        f"{c['unsupported_answers']['checked']} answers.",
    ]


def _judge_and_failures(summary: dict[str, Any]) -> list[str]:
    """The judge's label counts, its canary and the system's failed records."""
    f = summary["failures"]
    judge = summary["judge"]["counts"]
    return [
        "",
        f"Judge labels: full {judge['full']}, partial {judge['partial']}, none {judge['none']}.",
        "",
        _canary_line(summary["judge"].get("canary") or {}),
        "",
        (
            f"Failures: {f['total']} records; by condition {json.dumps(f['by_condition'])}, "
            f"by stage {json.dumps(f['by_stage'])}, by kind {json.dumps(f['by_kind'])}."
            if f["total"]
            else "Failures: none."
        ),
        "",
    ]


def _canary_line(canary: dict[str, Any]) -> str:
    """What the answer-independence canary found, with its n, even when it found nothing."""
    failed = f"; {canary['failed']} canary calls failed" if canary.get("failed") else ""
    if not canary.get("records"):
        return (
            "Answer-independence canary: not run on any record (`judge.canary.enabled: false`, "
            f"no record drawn, or records made before it){failed}."
        )
    kinds = canary.get("by_answer") or {"/".join(canary["answers"]): canary}
    each = "; ".join(
        f"{kind} answer {c['full'] + c['partial']} of {c['labels']}" for kind, c in kinds.items()
    )
    warn = f", warned from {100 * canary['warn_rate']:.0f}%" if "warn_rate" in canary else ""
    return (
        f"Answer-independence canary: nugget labels full or partial: {each} "
        f"({canary['records']} records of {canary['instances']} instances sampled{failed}); "
        f"a judge that reads the answer gives (nearly) none{warn}."
    )


def figures(systems: list[tuple[str, dict[str, Any]]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, summary in systems:
        xs, ys, lows, highs = [], [], [], []
        for k, condition in enumerate(MAIN_COLUMNS):
            entry = summary["scores"].get(condition, {}).get("restore_score_100")
            if entry:
                xs.append(k)
                ys.append(entry["mean"])
                lows.append(entry["mean"] - entry["low"])
                highs.append(entry["high"] - entry["mean"])
        ax.errorbar(xs, ys, yerr=[lows, highs], marker="o", capsize=3, label=name)
    ax.set_xticks(range(len(MAIN_COLUMNS)), ["blurred", "k=1", "k=2", "k=3", "oracle"])
    ax.set_ylabel("restore_score_100")
    ax.set_ylim(0, 100)
    ax.set_title("Score vs. clarification turns")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "score_vs_k.png")
    _save(fig, paths[-1])
    plt.close(fig)

    for key, title, name in (
        ("question_type_share", "Question-type mix", "question_types.png"),
        ("unknown_rate_per_type", "UA unknown rate per question type", "unknown_rate_per_type.png"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        width = 0.8 / max(1, len(systems))
        for s, (system, summary) in enumerate(systems):
            shown = summary["clarification"][key]
            values = [
                (shown[t]["rate"] if isinstance(shown[t], dict) else shown[t]) or 0.0
                for t in QUESTION_TYPES
            ]
            ax.bar([i + s * width for i in range(len(QUESTION_TYPES))], values, width, label=system)
        ax.set_xticks(
            [i + width * (len(systems) - 1) / 2 for i in range(len(QUESTION_TYPES))],
            QUESTION_TYPES,
            rotation=30,
        )
        ax.set_ylim(0, 1)
        ax.set_title(title)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / name)
        _save(fig, paths[-1])
        plt.close(fig)
    return paths


def _save(fig: Figure, path: Path) -> None:
    """A PNG whole or not at all (a full disk: StorageFull)."""
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    write_whole(path, image.getvalue())


#: Where report.html looks for a running `cts view` (the page's `?viewer=URL` overrides it).
VIEWER_URL = "http://127.0.0.1:8765"

#: Probes the viewer; only if it answers, links each system's row and cells into it. Offline,
#: or with no viewer up, the page is unchanged. The run list is JSON data, never markup.
_VIEWER_SCRIPT = """(function () {
  var base = new URLSearchParams(location.search).get("viewer") || "%s";
  base = base.replace(/\\/+$/, "");
  if (!/^https?:\\/\\//.test(base) || !window.fetch) return;
  var runs = JSON.parse(document.getElementById("cts-viewer-runs").textContent);
  function link(text, query) {
    var a = document.createElement("a");
    a.href = base + "/#/?" + new URLSearchParams(query);
    a.className = "viewer-link";
    a.textContent = text;
    return a;
  }
  fetch(base + "/api/ping", { mode: "no-cors", cache: "no-store" }).then(function () {
    var list = document.getElementById("cts-viewer-links");
    document.getElementById("cts-viewer-url").textContent = base;
    runs.forEach(function (run) {
      var item = document.createElement("li");
      item.append(link(run.name, { runpath: run.path }), " · ",
        link("failed records", { runpath: run.path, failed: "1" }));
      list.append(item);
    });
    document.querySelectorAll("table").forEach(function (table) {
      var head = Array.prototype.map.call(table.rows[0].cells, function (c) {
        return c.textContent;
      });
      Array.prototype.slice.call(table.rows, 1).forEach(function (row) {
        var run = runs.find(function (r) { return r.name === row.cells[0].textContent; });
        if (!run) return;
        Array.prototype.forEach.call(row.cells, function (cell, i) {
          var query = { runpath: run.path };
          if (i > 0 && head[i].indexOf("@") < 0 && ["blurred", "oracle"].indexOf(head[i]) < 0)
            return;
          if (i > 0) query.condition = head[i];
          cell.append(" ", link("↗", query));
        });
      });
    });
    document.getElementById("cts-viewer").hidden = false;
  }, function () {});
})();"""


def _viewer_block(runs: Sequence[tuple[str, Path]]) -> str:
    listed = [{"name": name, "path": str(path)} for name, path in runs]
    # JSON inside <script>: `<` escaped so that no text in it can close the element.
    data = json.dumps(listed, ensure_ascii=False).replace("<", "\\u003c")
    return (
        '<div id="cts-viewer" class="viewer" hidden><p>The records behind these numbers, '
        'in <code>cts view</code> at <span id="cts-viewer-url"></span>:</p>'
        '<ul id="cts-viewer-links"></ul></div>'
        f'<script type="application/json" id="cts-viewer-runs">{data}</script>'
        f"<script>{_VIEWER_SCRIPT % VIEWER_URL}</script>"
    )


def _inline(text: str) -> str:
    """Escaped text with its `code` spans as <code> and **bold** as <strong>: the Markdown
    the report writes inline."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


def to_html(markdown_text: str, images: list[Path], runs: Sequence[tuple[str, Path]] = ()) -> str:
    """A self-contained page: the Markdown tables as HTML tables, figures inlined as base64.
    With `runs` (each system's name and run directory), links into `cts view` appear when
    one is running."""
    body: list[str] = []
    rows: list[list[str]] = []
    items: list[str] = []

    def flush() -> None:
        if rows:
            head, *rest = rows
            body.append(
                "<table><tr>"
                + "".join(f"<th>{_inline(c)}</th>" for c in head)
                + "</tr>"
                + "".join(
                    "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rest
                )
                + "</table>"
            )
            rows.clear()
        if items:
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    for line in markdown_text.splitlines():
        if line.startswith("|"):
            cells = _row_cells(line)
            if not all(set(c) <= {"-"} for c in cells):
                rows.append(cells)
            continue
        if line.startswith("- "):
            items.append(line[2:])
            continue
        flush()
        if line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
            if runs:
                body.append(_viewer_block(runs))
        elif line.strip():
            body.append(f"<p>{_inline(line)}</p>")
    flush()
    for image in images:
        data = base64.b64encode(image.read_bytes()).decode()
        body.append(
            f'<figure><img alt="{image.stem}" src="data:image/png;base64,{data}">'
            f"<figcaption>{image.stem}</figcaption></figure>"
        )
    style = (
        "body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:"
        "collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:"
        "right}td:first-child,th:first-child{text-align:left}img{max-width:100%}"
        ".viewer{background:#eef4ff;padding:.2em 1em}"
        # Printed (A4): no viewer links, and no figure or table row cut across two pages.
        "@media print{.viewer,.viewer-link{display:none}body{margin:0;max-width:none}"
        "figure,tr,img{break-inside:avoid}h1,h2{break-after:avoid}}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Clarify-Then-Search report"
        f"</title><style>{style}</style></head><body>{''.join(body)}</body></html>"
    )


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


def write_report(
    run_dirs: list[Path],
    out: Path,
    failures: FailurePolicy | None = None,
    min_gap: float | None = None,
    allow_unlike: bool = False,
) -> dict[str, Path]:
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
    return {
        "summary": files.summary,
        "markdown": files.report_md,
        "html": files.report_html,
        "figures": files.figures,
    }
