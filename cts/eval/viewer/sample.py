"""One sample as `cts view` shows it: a record with all it stands on (its run, its instance's
queries, the dialogue, the nuggets with the judge's labels and quotes marked in the answer, the
search trace turn by turn, and what could not be read), every text cut (cts/eval/viewer/cuts.py).
Apart from the index because what a sample shows changes without what the index lists; the
trace's turns (trace.py) and the quote marks (highlight.py) are parts of it kept apart again.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from cts.agents.types import UNKNOWN
from cts.eval.data.schema import Instance, Record
from cts.eval.viewer.cuts import Cuts
from cts.eval.viewer.highlight import highlight
from cts.eval.viewer.runs import ViewRun
from cts.eval.viewer.trace import trace_turns


def nugget_rows(record: Record, instance: Instance | None) -> list[dict[str, Any]]:
    """Each golden nugget with the judge's label and quote for this record; labels of
    nuggets the dataset no longer holds are kept, without text."""
    golden = instance.golden.nuggets if instance and instance.golden else []
    rows = []
    for nugget in golden:
        label = record.labels.get(nugget.id, {})
        rows.append(
            {
                "id": nugget.id,
                "text": nugget.text,
                "weight": nugget.weight,
                "label": label.get("label"),
                "evidence": label.get("evidence"),
                "position": label.get("position"),
            }
        )
    known = {n.id for n in golden}
    for nugget_id, label in record.labels.items():
        if nugget_id not in known:
            rows.append(
                {
                    "id": nugget_id,
                    "text": None,
                    "weight": None,
                    "label": label.get("label"),
                    "evidence": label.get("evidence"),
                    "position": label.get("position"),
                }
            )
    return rows


def _malformed_steps(turns: list[dict[str, Any]]) -> str | None:
    """The trace's steps of the wrong shape, turn by turn: the sample's trace_error."""
    found = [
        f"turn {n}: {problem}"
        for n, turn in enumerate(turns, 1)
        for problem in (turn["observation"] or {}).get("malformed", [])
    ]
    if not found:
        return None
    return f"malformed trace steps (shown without them): {'; '.join(found)}"


def _scope_note(outside: str | None) -> str | None:
    """Why the report ignores a record config.yaml no longer names; None for one it names."""
    if outside is None:
        return None
    return (
        f"Outside what the run's config.yaml names ({outside}): its report ignores "
        "this record, kept from before the run was resumed narrower."
    )


def _instance_part(instance: Instance | None) -> dict[str, Any] | None:
    """The instance's queries, language and removed constraints; None when it is not read."""
    if instance is None:
        return None
    return {
        "blurred_query": instance.blurred_query,
        "fused_query": instance.fused_query,
        "language": instance.language,
        "removed_constraints": list(instance.removed_constraints),
    }


def _dialogue(record: Record) -> list[dict[str, Any]]:
    """Each clarifying question with its answer (None when there is none) and types."""
    return [
        {
            "question": q,
            "answer": record.answers[i] if i < len(record.answers) else None,
            "question_types": record.question_types[i] if i < len(record.question_types) else [],
            "unknown": i < len(record.answers) and record.answers[i] == UNKNOWN,
        }
        for i, q in enumerate(record.questions)
    ]


def _trace_part(trace: dict[str, Any] | None, turns: list[dict[str, Any]]) -> dict[str, Any] | None:
    """How the search run ended, what it cost, and its turns; None without a trace."""
    if trace is None:
        return None
    return {
        "termination": trace.get("termination"),
        "error": trace.get("error"),
        "llm_calls": trace.get("llm_calls"),
        "seconds": trace.get("seconds"),
        "turns": turns,
    }


def sample_detail(view: ViewRun, record: Record, key: dict[str, Any]) -> dict[str, Any]:
    """One record of `view` with all it stands on: instance, dialogue, search trace, labels.
    `key` is the record as the request named it (run, instance, condition, seed): what the
    links to its raw record and trace name."""
    instance, instance_error = view.instance(key["instance"])
    trace, trace_error = view.trace(record)
    cuts = Cuts()
    turns = trace_turns(trace, cuts) if trace is not None else []
    trace_error = trace_error or _malformed_steps(turns)
    nuggets = cuts.json(nugget_rows(record, instance))
    quotes = {n["id"]: n["evidence"] or "" for n in nuggets}
    outside = view.outside.get(record.key)
    shown = {
        "run": {"id": view.index, "name": view.name, "path": str(view.root)},
        "record": record.model_dump(mode="json"),
        "in_scope": outside is None,
        "scope_note": _scope_note(outside),
        "instance": _instance_part(instance),
        "instance_error": instance_error,
        "dialogue": _dialogue(record),
        "nuggets": nuggets,
        "answer_segments": highlight(cuts.text(record.answer), quotes),
        "trace": _trace_part(trace, turns),
        "trace_error": trace_error,
        "raw": {
            part: f"/api/raw?{urlencode({**key, 'part': part})}" for part in ("record", "trace")
        },
    }
    bounded: dict[str, Any] = cuts.json(shown)
    bounded["cut"] = cuts.cut  # a text was cut: the page says so, with the raw links
    return bounded
