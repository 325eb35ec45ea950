"""The lines a reader of a report must not miss: failed records, failed tool calls, mixed
dialogues, a dependent oracle, ignored records, a judge that gives one label, a canary that got
credit.

Apart from the Markdown (cts/eval/report/markdown.py) because the command line prints them too
(cts/cli/common.py), and because what deserves a warning changes for other reasons than how a
table looks.
"""

from __future__ import annotations

from typing import Any

from cts.eval.report.diagnostics import DEGENERATE_SHARE, excluded_for_failures
from cts.eval.run.oracle import oracle_warning
from cts.eval.run.scope import ignored_note


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
