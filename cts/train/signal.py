"""Whether a sampling gave the loop something to prefer: how far the rewards of one state's
candidates lie apart, and what the kept questions asked.

A kept question (a preference pair's chosen question, an SFT example's) is *about a removed
constraint* when, in a sampled dialogue that asked it, the User Answerer's answer holds one of
the instance's removed spans (both in `normal_form`); for instances that record no spans, the
figure is the answered share only (an answer that is not `unknown`). A loop whose kept
questions are rarely about a removed constraint learns to ask something else."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from statistics import mean
from typing import Any

from cts.agents.types import UNKNOWN
from cts.eval.data.schema import Instance, Record, normal_form

#: Kept: (instance id, turn, question as the candidates normalise it).
Kept = tuple[str, int, str]


def spread_figures(spreads: Sequence[float], tie: float) -> dict[str, Any]:
    """The reward spread (best − worst candidate) over the states with two candidates or
    more: its mean and max, and how many states' candidates lie apart (more than `tie`)."""
    return {
        "states": len(spreads),
        "mean": round(mean(spreads), 3) if spreads else None,
        "max": round(max(spreads), 3) if spreads else None,
        "apart": sum(s > tie for s in spreads),
    }


def _answers(records: Iterable[Record]) -> dict[Kept, list[str]]:
    """Every answer each (instance, turn, question) got in the sampled dialogues."""
    found: dict[Kept, list[str]] = {}
    for record in records:
        # A failed dialogue may hold a question without its answer: only answered turns count.
        asked = zip(record.questions, record.answers, strict=False)
        for turn, (question, answer) in enumerate(asked, 1):
            key = (record.instance_id, turn, " ".join(question.split()))
            found.setdefault(key, []).append(answer)
    return found


def kept_questions(
    kept: Sequence[Kept], records: Iterable[Record], instances: dict[str, Instance]
) -> dict[str, Any]:
    """Of the kept questions: how many the User Answerer answered with a value, and how many
    of those on instances with removed spans got an answer holding one (n: each figure's)."""
    answers = _answers(records)
    answered = about = with_spans = 0
    for instance_id, turn, question in kept:
        got = [a for a in answers.get((instance_id, turn, question), []) if a.strip() != UNKNOWN]
        answered += bool(got)
        spans = [normal_form(s) for s in instances[instance_id].removed_spans if s.strip()]
        if spans:
            with_spans += 1
            about += any(s in normal_form(a) for a in got for s in spans)
    return {
        "n": len(kept),
        "answered": answered,
        "with_spans": with_spans,
        "about_removed": about,
    }
