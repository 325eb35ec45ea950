"""The report's Markdown (report.md): the preamble that says how to read every number, the
paper-style main table, the comparisons, each system's own section, and the cells they print.

Apart from cts/eval/report/report.py, which loads the runs and computes the summary: the text
changes with how the numbers are shown, not with what they are. The HTML page
(cts/eval/report/html.py) is rendered from this text; `row_cells` reads its table rows back.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from cts.agents.question_type import QUESTION_TYPES
from cts.eval.report.comparability import parts
from cts.eval.report.diagnostics import ALPHA
from cts.eval.report.warnings import warnings
from cts.eval.run.config_sections import ALL_CONDITIONS
from cts.eval.score.power import can_reject

#: The main table's columns, in order (the figures' x axis and the comparisons follow them).
MAIN_COLUMNS: list[str] = list(ALL_CONDITIONS)


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
    cell, and a line break the row. `\\` and `|` are escaped; `row_cells` reads them back."""
    flat = re.sub(r"[\r\n]+", " ", str(text))
    return flat.replace("\\", "\\\\").replace("|", "\\|")


def row_cells(line: str) -> list[str]:
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
