"""From records to the numbers a paper needs: scores per condition with bootstrap CIs, gain over
blurred and gain recovered toward oracle, paired tests, and the clarification diagnostics
(UA answerability per turn and per k, all-unknown rate, question-type mix with per-type unknown
rate, region-only rate), plus failures by kind."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from statistics import mean
from typing import Any

from agents.question_type import QUESTION_TYPES
from agents.types import UNKNOWN
from eval.metrics import bootstrap_ci, gain_recovered, paired_test
from eval.pipeline import Record, clarify_turns

SCORE_VARIANTS = ("restore_score_100", "strict", "unweighted")


def _scored(records: Iterable[Record]) -> list[Record]:
    return [r for r in records if r.error is None and r.scores]


def _by_condition(records: Iterable[Record]) -> dict[str, list[Record]]:
    grouped: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        grouped[r.condition].append(r)
    return dict(grouped)


def _mean_over_seeds(records: list[Record], variant: str) -> dict[str, float]:
    """Instance id → score averaged over seeds (the unit the CIs resample)."""
    per_instance: dict[str, list[float]] = defaultdict(list)
    for r in records:
        per_instance[r.instance_id].append(r.scores[variant])
    return {i: mean(v) for i, v in per_instance.items()}


def score_table(records: list[Record], conditions: list[str]) -> dict[str, Any]:
    """Per condition and score variant: mean with a 95% CI over instances, n, and per seed."""
    grouped = _by_condition(_scored(records))
    table: dict[str, Any] = {}
    for condition in conditions:
        rows = grouped.get(condition, [])
        entry: dict[str, Any] = {"n_records": len(rows)}
        for variant in SCORE_VARIANTS:
            values = list(_mean_over_seeds(rows, variant).values())
            if values:
                ci = bootstrap_ci(values)
                entry[variant] = {"mean": ci.mean, "low": ci.low, "high": ci.high, "n": ci.n}
        entry["per_seed"] = {
            str(seed): mean(r.scores["restore_score_100"] for r in rows if r.seed == seed)
            for seed in sorted({r.seed for r in rows})
        }
        table[condition] = entry
    return table


def gains(records: list[Record], conditions: list[str]) -> dict[str, Any]:
    """Each clarify@k against blurred (paired over instances) and the gain recovered toward
    oracle: (score − blurred) / (oracle − blurred) on the condition means."""
    grouped = _by_condition(_scored(records))
    blurred = _mean_over_seeds(grouped.get("blurred", []), "restore_score_100")
    oracle = _mean_over_seeds(grouped.get("oracle", []), "restore_score_100")
    out: dict[str, Any] = {}
    for condition in conditions:
        if condition == "blurred":
            continue
        scores = _mean_over_seeds(grouped.get(condition, []), "restore_score_100")
        shared = sorted(set(scores) & set(blurred))
        if not shared:
            continue
        test = paired_test([scores[i] for i in shared], [blurred[i] for i in shared])
        entry: dict[str, Any] = {
            "gain_over_blurred": test.mean_difference,
            "low": test.low,
            "high": test.high,
            "p_value": test.p_value,
            "n": test.n,
        }
        both = sorted(set(shared) & set(oracle))
        if both:
            entry["gain_recovered"] = gain_recovered(
                mean(scores[i] for i in both),
                mean(blurred[i] for i in both),
                mean(oracle[i] for i in both),
            )
        out[condition] = entry
    return out


def clarification(records: list[Record]) -> dict[str, Any]:
    """Answerability and question types over every clarify@k record (errors excluded)."""
    asked = [r for r in records if clarify_turns(r.condition) and r.error is None]
    per_turn: dict[int, list[bool]] = defaultdict(list)
    per_k: dict[int, list[bool]] = defaultdict(list)
    all_unknown: dict[int, list[bool]] = defaultdict(list)
    region_only: list[bool] = []
    types: Counter[str] = Counter()
    unknown_by_type: Counter[str] = Counter()
    stopped: dict[int, list[bool]] = defaultdict(list)
    for r in asked:
        k = clarify_turns(r.condition) or 0
        answered = [a != UNKNOWN for a in r.answers]
        for turn, ok in enumerate(answered, 1):
            per_turn[turn].append(ok)
        per_k[k].extend(answered)
        all_unknown[k].append(bool(answered) and not any(answered))
        region_only.append(bool(r.question_types) and set(r.question_types) == {"region"})
        stopped[k].append(r.stopped_early)
        for kind, answer in zip(r.question_types, r.answers, strict=True):
            types[kind] += 1
            unknown_by_type[kind] += answer == UNKNOWN

    def rate(values: list[bool]) -> float | None:
        return sum(values) / len(values) if values else None

    checked = [
        bool(words)
        for r in asked
        for words, answer in zip(r.unsupported_words, r.answers, strict=False)
        if answer != UNKNOWN
    ]
    total = sum(types.values())
    return {
        "answerability_per_turn": {str(t): rate(v) for t, v in sorted(per_turn.items())},
        "answerability_per_k": {str(k): rate(v) for k, v in sorted(per_k.items())},
        "all_unknown_rate_per_k": {str(k): rate(v) for k, v in sorted(all_unknown.items())},
        "stopped_early_rate_per_k": {str(k): rate(v) for k, v in sorted(stopped.items())},
        "question_type_mix": {t: (types[t] / total if total else 0.0) for t in QUESTION_TYPES},
        "question_type_counts": {t: types[t] for t in QUESTION_TYPES},
        "unknown_rate_per_type": {
            t: (unknown_by_type[t] / types[t] if types[t] else None) for t in QUESTION_TYPES
        },
        "region_only_rate": rate(region_only),
        # Abstractive User Answerer only: answers with content words not in the fused query.
        "unsupported_answers": {"checked": len(checked), "rate": rate(checked)},
    }


def reuse(records: list[Record]) -> dict[str, Any]:
    """Per condition, how many search-agent model calls the response cache answered: for
    blurred and oracle, which do not depend on the clarifier, this shows that a second
    clarifier's run re-used the first run's searches instead of recomputing them."""
    calls: Counter[str] = Counter()
    cached: Counter[str] = Counter()
    for r in records:
        calls[r.condition] += r.usage.get("search_llm_calls", 0)
        cached[r.condition] += r.usage.get("search_cached_calls", 0)
    return {c: {"search_llm_calls": calls[c], "cached": cached[c]} for c in calls}


def failures(records: list[Record]) -> dict[str, Any]:
    kinds = Counter(r.error["kind"] for r in records if r.error)
    stages = Counter(r.error["stage"] for r in records if r.error)
    return {"total": sum(kinds.values()), "by_kind": dict(kinds), "by_stage": dict(stages)}


def summarize(records: list[Record], conditions: list[str]) -> dict[str, Any]:
    return {
        "records": len(records),
        "instances": len({r.instance_id for r in records}),
        "seeds": sorted({r.seed for r in records}),
        "scores": score_table(records, conditions),
        "gains": gains(records, conditions),
        "clarification": clarification(records),
        "reuse": reuse(records),
        "failures": failures(records),
    }
