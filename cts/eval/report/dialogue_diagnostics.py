"""The clarification dialogues' diagnostics in a report (cts/eval/report/diagnostics.py): how often
a question was asked and answered, `unknown` answers, over-answers (an answer that reveals a
removed constraint it was not asked about), dialogues whose recorded turns do not match, and the
score split by whether the question was answered. Every rate carries its n."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from cts.agents.question_type import QUESTION_TYPES
from cts.agents.types import UNKNOWN
from cts.eval.data.schema import Record
from cts.eval.run.pipeline import clarify_turns
from cts.eval.score.metrics import (
    SCORE,
    mean,
)
from cts.eval.score.over_answer import MOST as MOST_OF_FUSED

#: The study's unknown rate of region-only questions (its region finding).
STUDY_REGION_UNKNOWN = "0.75–0.87"


def _rate(values: list[bool]) -> dict[str, Any]:
    return {"rate": sum(values) / len(values) if values else None, "n": len(values)}


def _asked(records: Iterable[Record]) -> list[Record]:
    return [r for r in records if clarify_turns(r.condition) and r.error is None]


def _dialogues(asked: list[Record], mode: str) -> list[Record]:
    """One record per dialogue: in sequential mode clarify@j repeats the first j turns of one
    dialogue, so each (instance, seed) counts its longest record only."""
    if mode != "sequential":
        return asked
    longest: dict[tuple[str, int], Record] = {}
    for r in asked:
        key = (r.instance_id, r.seed)
        if key not in longest or len(r.questions) > len(longest[key].questions):
            longest[key] = r
    return list(longest.values())


def dialogue_mismatches(records: Iterable[Record]) -> list[tuple[str, int]]:
    """(instance, seed) whose clarify@j questions are not the first j of its clarify@k ones:
    sequential runs build them from one dialogue, so any mismatch means records from
    different dialogues were mixed (e.g. a run resumed with another clarifier)."""
    by_key: dict[tuple[str, int], list[list[str]]] = defaultdict(list)
    for r in _asked(records):
        by_key[(r.instance_id, r.seed)].append(r.questions)
    return sorted(
        key
        for key, asked in by_key.items()
        if any(q[: len(p)] != p for p in asked for q in asked if len(q) >= len(p))
    )


def clarification(records: list[Record], mode: str = "sequential") -> dict[str, Any]:
    """Answerability and question types over the clarify@k records that did not fail."""
    asked = _asked(records)
    per_turn: dict[int, dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
    per_k: dict[int, list[bool]] = defaultdict(list)
    all_unknown: dict[int, list[bool]] = defaultdict(list)
    stopped: dict[int, list[bool]] = defaultdict(list)
    all_region: list[bool] = []
    for r in asked:
        k = clarify_turns(r.condition) or 0
        answered = [a != UNKNOWN for a in r.answers]
        for turn, ok in enumerate(answered, 1):
            per_turn[k][turn].append(ok)
        per_k[k].extend(answered)
        if answered:  # a clarifier that stopped before asking has nothing to be unknown
            all_unknown[k].append(not any(answered))
        stopped[k].append(r.stopped_early)
    dialogues = _dialogues(asked, mode)
    for r in dialogues:
        if r.question_types:
            all_region.append(all("region" in types for types in r.question_types))
    questions = [
        (types, answer)
        for r in dialogues
        for types, answer in zip(r.question_types, r.answers, strict=True)
    ]
    counts: Counter[str] = Counter()
    unknown: Counter[str] = Counter()
    for types, answer in questions:
        for kind in types:
            counts[kind] += 1
            unknown[kind] += answer == UNKNOWN
    checked = [
        bool(words)
        for r in asked
        for words, answer in zip(r.unsupported_words, r.answers, strict=False)
        if answer != UNKNOWN
    ]
    by_k = sorted(per_k)
    return {
        "mode": mode,
        "answerability_per_k": {str(k): _rate(per_k[k]) for k in by_k},
        "answerability_per_turn": {
            str(k): {str(t): _rate(v) for t, v in sorted(per_turn[k].items())} for k in by_k
        },
        "all_unknown_rate_per_k": {str(k): _rate(all_unknown[k]) for k in by_k},
        "stopped_early_rate_per_k": {str(k): _rate(stopped[k]) for k in by_k},
        # Shares of the questions asked; a question of several types counts in each.
        "questions": len(questions),
        "question_type_counts": {t: counts[t] for t in QUESTION_TYPES},
        "question_type_share": {
            t: (counts[t] / len(questions) if questions else None) for t in QUESTION_TYPES
        },
        "unknown_rate_per_type": {
            t: {"rate": unknown[t] / counts[t] if counts[t] else None, "n": counts[t]}
            for t in QUESTION_TYPES
        },
        # The study's region figure: of the questions whose only type is region, the share
        # answered unknown; then the same over every question with region among its types.
        "region_only_unknown_rate": {
            **_unknown_rate([a for types, a in questions if list(types) == ["region"]]),
            "study": STUDY_REGION_UNKNOWN,
        },
        "any_region_unknown_rate": _unknown_rate([a for t, a in questions if "region" in t]),
        # Not the study's figure: dialogues (as counted for the question types) in which every
        # question asked about region.
        "all_region_interaction_rate": _rate(all_region),
        **_over_answers(asked),
        "dialogue_mismatches": len(dialogue_mismatches(records)) if mode == "sequential" else 0,
        # Abstractive User Answerer only: answers with content words not in the fused query.
        "unsupported_answers": {"checked": len(checked), "rate": _rate(checked)["rate"]},
    }


def _over_answers(asked: list[Record]) -> dict[str, Any]:
    """Per k, of the answers other than `unknown`: the share that over-answer (reveal two or
    more pieces of the fused query's missing information, cts/eval/score/over_answer.py) and the
    share that hold most of the fused query; how the pieces were found; and how many answers of
    records written before answers were measured are left out."""
    over: dict[int, list[bool]] = defaultdict(list)
    most: dict[int, list[bool]] = defaultdict(list)
    basis: Counter[str] = Counter()
    unmeasured = 0
    for r in asked:
        if len(r.answer_reveals) != len(r.answers):
            unmeasured += sum(a != UNKNOWN for a in r.answers)
            continue
        k = clarify_turns(r.condition) or 0
        for answer, found in zip(r.answers, r.answer_reveals, strict=True):
            if answer != UNKNOWN:
                over[k].append(found["revealed"] >= found.get("needed", 2))
                most[k].append(found["share"] > MOST_OF_FUSED)
                basis[found["basis"]] += 1
    return {
        "over_answer_rate_per_k": {str(k): _rate(over[k]) for k in sorted(over)},
        "most_of_fused_rate_per_k": {str(k): _rate(most[k]) for k in sorted(most)},
        "over_answer_basis": dict(sorted(basis.items())),
        "over_answer_unmeasured": unmeasured,
    }


def _unknown_rate(answers: list[str]) -> dict[str, Any]:
    """The share of `answers` that are `unknown`, with how many were and the n."""
    unknown = sum(a == UNKNOWN for a in answers)
    return {
        "rate": unknown / len(answers) if answers else None,
        "unknown": unknown,
        "n": len(answers),
    }


def _mean_n(values: list[float]) -> dict[str, Any]:
    return {"mean": mean(values) if values else None, "records": len(values)}


def score_by_answered(records: list[Record]) -> dict[str, Any]:
    """Per k, the restore score of scored clarify@k records (an instance counts once per seed)
    in which at least one answer was not `unknown`, against those in which every answer was
    (the clarification told nothing)."""
    split: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in _asked(records):
        if r.scored and r.answers:
            group = "all_unknown" if all(a == UNKNOWN for a in r.answers) else "some_answered"
            split[clarify_turns(r.condition) or 0][group].append(r.scores[SCORE])
    return {
        str(k): {g: _mean_n(split[k][g]) for g in ("some_answered", "all_unknown")}
        for k in sorted(split)
    }
