"""From records to the numbers a paper needs (docs/reading-the-report.md), every one with the n it
stands on.

Scores: per condition, each instance's score is its mean over seeds. Failed records are never a
silent 0 nor silently dropped: under the `exclude` policy (the default) the score table, gains,
gain recovered and breakdowns stand on the instances scored under every condition (and, in a
report of several runs, in every run): paired, the others listed with why; under `zero` a
failed record scores 0 and the report says so. Systems are compared per condition on the
instances both scored under it. Gain recovered is guarded against a missing or tiny oracle gap.

Clarification diagnostics are descriptive rates over the clarify@k records that did not fail,
each with its own n:
User Answerer answerability per turn within each k and per k, all-unknown rate, question-type
mix (a question may have several types) with the unknown rate per type — the study's region
figure is the unknown rate of region-only questions (whose only type is region), shown beside
the unknown rate of any-region questions — over-answering (cts/eval/score/over_answer.py) beside
answerability, the score split by whether any answer was given, breakdowns per language and
removed constraint, and the judge's checks: one label dominating the run, a language or a
condition (degenerate), and the answer-independence canary.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from cts.eval.data.schema import Record
from cts.eval.report.dialogue_diagnostics import (
    clarification,
    score_by_answered,
)
from cts.eval.run.pipeline import clarify_turns
from cts.eval.score.metrics import (
    SCORE,
    bootstrap_cis,
    gain_recovered_ci,
    holm,
    mean,
    paired_differences,
    paired_tests,
)
from cts.eval.score.power import component_cis, components, difference_noise, mde, paired_mde

SCORE_VARIANTS = (SCORE, "strict", "unweighted")
FailurePolicy = Literal["exclude", "zero"]
#: One judge label this common says the judge does not discriminate.
DEGENERATE_SHARE = 0.95
#: A language's or condition's labels are checked for one dominant label from this many on:
#: fewer say little either way.
DEGENERATE_MIN_LABELS = 10
#: The level of every test and MDE in a report (α/m on a Holm row).
ALPHA = 0.05
#: How an instance's why reads when a failed record left it unscored (`score_records`).
FAILED_AT = ": failed at "


@dataclass
class Scored:
    """One run's scores, instance by instance, under a failure policy."""

    #: condition → instance → score variant → mean over seeds.
    values: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    #: condition → seed → instance → restore score.
    per_seed: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)
    #: instance → why it has no score under some condition.
    problems: dict[str, list[str]] = field(default_factory=dict)
    #: condition → instances with a failed record (any seed).
    failed: dict[str, set[str]] = field(default_factory=dict)
    #: Every instance scored or not: the run's configured ones and any a record holds.
    instances: set[str] = field(default_factory=set)

    def complete(self, conditions: Iterable[str]) -> set[str]:
        """Instances with a score under every one of `conditions`."""
        sets = [set(self.values.get(c, {})) for c in conditions]
        return set.intersection(*sets) if sets else set()


def score_records(
    records: Iterable[Record],
    conditions: list[str],
    seeds: list[int],
    policy: FailurePolicy,
    instances: Iterable[str] = (),
) -> Scored:
    """An instance is scored under a condition when all its seeds are: each scored, or (policy
    `zero`) failed and counted 0. A missing record, an unscorable instance (no golden nuggets)
    and (policy `exclude`) a failure leave it unscored there, with the reason. `instances`: the
    ones the run's config names, so that one without any record is listed too, not lost."""
    keyed = {r.key: r for r in records}
    scored = Scored(instances={r.instance_id for r in keyed.values()} | set(instances))
    for instance in sorted(scored.instances):
        for condition in conditions:
            per_seed: dict[int, dict[str, float]] = {}
            for seed in seeds:
                record = keyed.get((instance, condition, seed))
                why = None
                if record is None:
                    why = f"{condition} seed {seed}: no record"
                elif record.error is not None:
                    scored.failed.setdefault(condition, set()).add(instance)
                    if policy == "zero":
                        per_seed[seed] = dict.fromkeys(SCORE_VARIANTS, 0.0)
                        continue
                    why = (
                        f"{condition} seed {seed}{FAILED_AT}{record.error.get('stage', '?')} "
                        f"({record.error.get('kind', '?')})"
                    )
                elif not record.scores:
                    why = f"{condition} seed {seed}: not scored (no golden nuggets)"
                else:
                    per_seed[seed] = record.scores
                if why:
                    scored.problems.setdefault(instance, []).append(why)
            if len(per_seed) == len(seeds):
                scored.values.setdefault(condition, {})[instance] = {
                    v: mean(s[v] for s in per_seed.values()) for v in SCORE_VARIANTS
                }
                for seed, s in per_seed.items():
                    scored.per_seed.setdefault(condition, {}).setdefault(seed, {})[instance] = s[
                        SCORE
                    ]
    return scored


def excluded_for_failures(excluded: dict[str, list[str]]) -> int:
    """Of the excluded instances (summary `excluded_instances`: instance → why), those a failed
    record of this run left out; the others lack a record, or a score in another run."""
    return sum(any(FAILED_AT in why for why in whys) for whys in excluded.values())


def _column(scored: Scored, condition: str, ids: list[str], variant: str = SCORE) -> list[float]:
    return [scored.values[condition][i][variant] for i in ids]


def score_table(scored: Scored, conditions: list[str], ids: list[str]) -> dict[str, Any]:
    """Per condition and score variant: mean with a 95% CI over the paired instances `ids`;
    n (those instances) and the instances with a failed record under the condition; the mean
    per seed."""
    table: dict[str, Any] = {}
    # Every interval of the table at once: they share one resampling plan (see bootstrap_cis).
    cells = [(c, v) for c in conditions for v in SCORE_VARIANTS] if ids else []
    intervals = dict(
        zip(cells, bootstrap_cis([_column(scored, c, ids, v) for c, v in cells]), strict=True)
    )
    for condition in conditions:
        entry: dict[str, Any] = {
            "n": len(ids),
            "failed": len(scored.failed.get(condition, ())),
        }
        if ids:
            for variant in SCORE_VARIANTS:
                ci = intervals[(condition, variant)]
                entry[variant] = {"mean": ci.mean, "low": ci.low, "high": ci.high, "n": ci.n}
            seeds = scored.per_seed.get(condition, {})
            entry["per_seed"] = {
                str(seed): mean(seeds[seed][i] for i in ids) for seed in sorted(seeds)
            }
        table[condition] = entry
    return table


def gains(scored: Scored, conditions: list[str], ids: list[str], min_gap: float) -> dict[str, Any]:
    """Each condition against blurred on the paired instances: mean difference with a paired
    bootstrap CI and a sign-flip test; and gain recovered toward oracle, (score − blurred) /
    (oracle − blurred), with a paired bootstrap CI — undefined when the oracle beats blurred
    by less than `min_gap` points."""
    out: dict[str, Any] = {}
    if "blurred" not in conditions or not ids:
        return out
    blurred = _column(scored, "blurred", ids)
    oracle = _column(scored, "oracle", ids) if "oracle" in conditions else None
    against = [c for c in conditions if c != "blurred"]
    # The tests together: they share their flips and resamples (see paired_tests).
    tests = paired_tests([(_column(scored, c, ids), blurred) for c in against])
    for condition, test in zip(against, tests, strict=True):
        score = _column(scored, condition, ids)
        entry: dict[str, Any] = {
            "gain_over_blurred": test.mean_difference,
            "low": test.low,
            "high": test.high,
            "p_value": test.p_value,
            "n": test.n,
            **_detectable(scored, condition, "blurred", ids),
        }
        if oracle is not None and condition != "oracle":
            gap = mean(oracle) - mean(blurred)
            found = gain_recovered_ci(score, blurred, oracle, min_gap=min_gap)
            entry["gain_recovered"] = (
                {"undefined": True, "gap": gap, "min_gap": min_gap}
                if found is None
                else {
                    "value": found.value,
                    "low": found.low,
                    "high": found.high,
                    "n": found.n,
                    "undefined_share": found.undefined_share,
                    "gap": gap,
                }
            )
        out[condition] = entry
    return out


def _seed_scores(scored: Scored, condition: str, ids: list[str]) -> dict[str, list[float]]:
    """instance → its restore score per seed under `condition`."""
    seeds = scored.per_seed.get(condition, {})
    return {i: [seeds[s][i] for s in sorted(seeds)] for i in ids}


def _detectable(scored: Scored, condition: str, other: str, ids: list[str]) -> dict[str, Any]:
    """`mde`: the smallest true difference the paired test on these instances detects with
    80% power at α = 0.05 (cts/eval/score/power.py; None where the test cannot reject on so few);
    `noise`: its variance and the seeds' part."""
    if len(ids) < 2:
        return {"mde": None, "noise": None}
    noise = difference_noise(_seed_scores(scored, condition, ids), _seed_scores(scored, other, ids))
    return {"mde": mde(noise.variance, noise.instances, ALPHA), "noise": noise.as_dict()}


def variance_components(scored: Scored, conditions: list[str], ids: list[str]) -> dict[str, Any]:
    """Per condition, the between- and within-instance variance of restore scores over the
    paired instances and the seeds' share of it, each with a bootstrap 95% CI over those
    instances (`<part>_low`, `<part>_high`; cts/eval/score/power.py)."""
    out: dict[str, Any] = {}
    if len(ids) < 2:
        return out
    for condition in conditions:
        by_instance = _seed_scores(scored, condition, ids)
        table = np.array(list(by_instance.values()), dtype=np.float64)
        out[condition] = {**components(by_instance).as_dict(), **component_cis(table).as_dict()}
    return out


def breakdowns(
    records: list[Record], scored: Scored, conditions: list[str], ids: list[str]
) -> dict[str, Any]:
    """The restore score per language and per removed-constraint type, on the paired
    instances; an instance with several removed constraints counts in each."""
    language: dict[str, str] = {}
    removed: dict[str, list[str]] = {}
    for r in records:
        language.setdefault(r.instance_id, r.language or "?")
        removed.setdefault(r.instance_id, r.removed_constraints or ["none"])
    groups: dict[str, dict[str, list[str]]] = {"language": {}, "removed_constraint": {}}
    for i in ids:
        groups["language"].setdefault(language.get(i, "?"), []).append(i)
        for kind in removed.get(i, ["none"]):
            groups["removed_constraint"].setdefault(kind, []).append(i)
    return {
        by: {
            group: {
                "n": len(members),
                **{c: mean(_column(scored, c, members)) for c in conditions},
            }
            for group, members in sorted(found.items())
        }
        for by, found in groups.items()
    }


def _label_rates(labels: Counter[str], least: int = 1) -> dict[str, Any]:
    """Counts of each label; `degenerate` when one label takes at least 95% of them and there
    are at least `least` of them."""
    total = sum(labels.values())
    top, count = labels.most_common(1)[0] if labels else ("", 0)
    return {
        "counts": {label: labels[label] for label in ("full", "partial", "none")},
        "total": total,
        "dominant": top or None,
        "dominant_share": count / total if total else None,
        "degenerate": total >= least and bool(total) and count / total >= DEGENERATE_SHARE,
    }


def judge_labels(records: Iterable[Record], canary_warn: float = 0.1) -> dict[str, Any]:
    """How often the judge gave each label, over the run and per language and per condition;
    `degenerate` when one label takes at least 95% of them: the judge does not tell answers
    apart there (a judge that gives every English nugget `none` and every Chinese one `full`
    is not degenerate over the run). A group is flagged from DEGENERATE_MIN_LABELS labels on.
    Then the answer-independence canary (`canary_summary`, warning from `canary_warn`)."""
    records = list(records)
    overall: Counter[str] = Counter()
    groups: dict[str, dict[str, Counter[str]]] = {"language": {}, "condition": {}}
    for r in records:
        found = Counter(v["label"] for v in r.labels.values())
        overall.update(found)
        for by, group in (("language", r.language or "?"), ("condition", r.condition)):
            groups[by].setdefault(group, Counter()).update(found)
    return {
        **_label_rates(overall),
        **{
            f"by_{by}": {
                group: _label_rates(counts, DEGENERATE_MIN_LABELS)
                for group, counts in sorted(found.items())
            }
            for by, found in groups.items()
        },
        "canary": canary_summary(records, canary_warn),
    }


def canary_summary(records: Iterable[Record], warn_rate: float = 0.1) -> dict[str, Any]:
    """The answer-independence canary over the records that carry one: the nugget labels the
    judge gave against an answer that states no nugget, and how many were `full` or
    `partial`, overall, per language and per answer (`by_answer`, each `warn` when its share
    credited reaches `warn_rate`: a reading judge may credit a few by chance, an answer-blind
    one nearly all); records whose canary call failed are counted apart."""
    carried = [(r, r.canary) for r in records if r.canary is not None]
    judged = [(r, canary) for r, canary in carried if canary.error is None]
    labels: Counter[str] = Counter()
    by_language: dict[str, Counter[str]] = defaultdict(Counter)
    by_answer: dict[str, Counter[str]] = defaultdict(Counter)
    for r, canary in judged:
        found = Counter(canary.labels.values())
        labels.update(found)
        by_language[r.language or "?"].update(found)
        by_answer[canary.answer].update(found)

    def counted(found: Counter[str]) -> dict[str, Any]:
        total = sum(found.values())
        credited = found["full"] + found["partial"]
        rate = credited / total if total else None
        return {"labels": total, "full": found["full"], "partial": found["partial"], "rate": rate}

    answers = {kind: counted(found) for kind, found in sorted(by_answer.items())}
    for kind in answers.values():
        kind["warn"] = kind["rate"] is not None and kind["rate"] >= warn_rate
    return {
        "answers": sorted({canary.answer for _, canary in carried}),
        "records": len(judged),
        "instances": len({r.instance_id for r, _ in judged}),
        "failed": len(carried) - len(judged),
        **counted(labels),
        "warn_rate": warn_rate,
        "by_language": {lang: counted(found) for lang, found in sorted(by_language.items())},
        "by_answer": answers,
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
    failed = [r for r in records if r.error]
    return {
        "total": len(failed),
        "by_condition": dict(Counter(r.condition for r in failed)),
        # Records files refuse an error without them (cts/eval/run/runner.py parse_records); one
        # made in memory is counted under `?`, as `score_records` names it.
        "by_stage": dict(Counter(r.error.get("stage", "?") for r in failed if r.error)),
        "by_kind": dict(Counter(r.error.get("kind", "?") for r in failed if r.error)),
        # Failed searches and visits inside the search runs (each one an error observation).
        "tool_errors": {
            "total": sum(r.usage.get("search_tool_errors", 0) for r in records),
            "records": sum(1 for r in records if r.usage.get("search_tool_errors", 0)),
        },
    }


def summarize(
    records: list[Record],
    conditions: list[str],
    seeds: list[int],
    ids: list[str],
    scored: Scored,
    *,
    policy: FailurePolicy = "exclude",
    min_gap: float = 1.0,
    mode: str = "sequential",
    canary_warn: float = 0.1,
) -> dict[str, Any]:
    """One run's summary on the paired instances `ids` (see `paired_instances`); its canary
    warns from `canary_warn` (`judge.canary.warn_rate`)."""
    # The configured instances as well as the recorded ones: one without any record is left
    # out, and listed, like one with a failed record.
    instances = scored.instances | {r.instance_id for r in records}
    excluded = {
        i: scored.problems.get(i, ["not scored in every run of the report"])
        for i in sorted(instances - set(ids))
    }
    return {
        "records": len(records),
        "instances": len(instances),
        "seeds": seeds,
        "failure_policy": policy,
        "paired_instances": len(ids),
        "excluded_instances": excluded,
        "scores": score_table(scored, conditions, ids),
        "gains": gains(scored, conditions, ids, min_gap),
        "variance": variance_components(scored, conditions, ids),
        "clarification": clarification(records, mode),
        "score_by_answered": score_by_answered(records),
        "breakdowns": breakdowns(records, scored, conditions, ids),
        "judge": judge_labels(records, canary_warn),
        "reuse": reuse(records),
        "failures": failures(records),
    }


def paired_instances(runs: list[tuple[Scored, list[str]]]) -> list[str]:
    """The instances scored under every condition of every run (each run: its scores and
    conditions): what a report compares on."""
    sets = [scored.complete(conditions) for scored, conditions in runs]
    return sorted(set.intersection(*sets)) if sets else []


def _scores_on(scored: Scored, condition: str, keep: set[str] | None) -> dict[str, float]:
    """Instance → restore score under `condition`, only the instances of `keep` when given."""
    found = scored.values.get(condition, {})
    return {i: v[SCORE] for i, v in found.items() if keep is None or i in keep}


def compare_systems(
    systems: list[tuple[str, Scored]], conditions: list[str], ids: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    """Every pair of systems, per condition, on the instances both scored under it (with `ids`:
    those of `ids` both scored): the mean difference (first − second) with a paired bootstrap
    CI and sign-flip test; p-values Holm-corrected across the clarify@k conditions of each pair
    (the family of the question "does this clarifier beat that one"). `ids` serves a table
    that sets scores and differences side by side (the training loop's): there every figure
    must stand on the same instances, or a Δ would not be the difference of the scores shown."""
    keep = None if ids is None else set(ids)
    compared: list[tuple[int, int, str, dict[str, float], dict[str, float]]] = []
    for a in range(len(systems)):
        for b in range(a + 1, len(systems)):
            first, second = systems[a][1], systems[b][1]
            for condition in conditions:
                left = _scores_on(first, condition, keep)
                right = _scores_on(second, condition, keep)
                if set(left) & set(right):
                    compared.append((a, b, condition, left, right))
    # Every test at once: those on as many instances share their flips and resamples.
    tests = paired_differences([(left, right) for *_, left, right in compared])
    # A Holm row must clear α/m to be its family's first rejection: its MDE is at that level.
    family_size = Counter((a, b) for a, b, condition, *_ in compared if clarify_turns(condition))
    by_pair: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for (a, b, condition, left, right), test in zip(compared, tests, strict=True):
        differences = [left[i] - right[i] for i in sorted(set(left) & set(right))]
        alpha = ALPHA / family_size[(a, b)] if clarify_turns(condition) else ALPHA
        by_pair.setdefault((a, b), []).append(
            {
                "a": systems[a][0],
                "b": systems[b][0],
                "condition": condition,
                "difference": test.mean_difference,
                "low": test.low,
                "high": test.high,
                "p_value": test.p_value,
                "p_holm": None,
                "n": test.n,
                "mde": paired_mde(differences, alpha),
            }
        )
    rows: list[dict[str, Any]] = []
    for pair in by_pair.values():  # pairs in order, as they were appended
        family = {r["condition"]: r["p_value"] for r in pair if clarify_turns(r["condition"])}
        adjusted = holm(family) if family else {}
        for r in pair:
            r["p_holm"] = adjusted.get(r["condition"])
        rows += pair
    return rows
