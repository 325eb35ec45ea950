"""How far two judgements of the same answers agree (`cts judge agreement`): a run and its
rejudge, or two runs whose answers are the same (the response cache replays every role but a
changed judge).

Labels are paired on (instance, condition, seed, nugget id), and only where both runs judged
the same answer against the same nuggets; every other key is counted by why it is left out
(recorded in one run only, failed in both, a judge failure on one side) or listed as a
mismatch (different answers, different nuggets, failed before the judge on one side only), never
silently joined. On the paired labels: Cohen's κ over the three labels and strict (full vs the
rest), the 3×3 confusion matrix, agreement per instance, and κ per language and per removed
constraint type. On the paired records' scores: the restore score's difference per condition
with a paired bootstrap CI (cts/eval/score/metrics.py) and the smallest difference the test could
detect (its MDE, cts/eval/score/power.py), and how many labels and score points move from
one judgement to the other, with bootstrap CIs over instances: between two judgements by the same
judge (the same model config, sampling, `judge:` options and prompts), that is the judge's
noise floor — what re-reading alone moves — reported beside every comparison of that judge with
another. With runs of several systems, each judged more than once, Kendall's τ-b between the
systems' rankings under the first judgement and under each other one, per condition: does the
new judge change which clarifier wins at k?

Every figure carries its n. Pure functions over records; the pairing is cts/eval/audit/pairing.py
(whose `read_judgement` alone reads a run), the statistics cts/eval/score/kappa.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean

from cts.eval.audit.pairing import (
    Judgement,
    KeyAccount,
    LabelPair,
    Mismatch,
    Pairing,
    pair,
    reached_judge,
    replayed,
)
from cts.eval.run.config_sections import ALL_CONDITIONS
from cts.eval.score.kappa import (
    STRICT_LABELS,
    Confusion,
    Kappa,
    Tau,
    cohen_kappa,
    confusion,
    kendall_tau,
    strict,
)
from cts.eval.score.metrics import paired_test, ratio_ci
from cts.eval.score.power import paired_mde


@dataclass(frozen=True)
class GroupAgreement:
    """κ (3 labels and strict) on the labels of one language or removed-constraint type."""

    group: str
    kappa: Kappa
    strict_kappa: Kappa


@dataclass(frozen=True)
class InstanceAgreement:
    instance_id: str
    language: str
    #: The share of its nugget labels the two judgements agree on (3 labels).
    agreement: float
    #: Nugget labels compared, over its conditions and seeds.
    n: int


@dataclass(frozen=True)
class ScoreDifference:
    """restore_score_100 under the second judgement minus under the first, on the instances
    both judged under the condition (each instance's mean over its paired seeds): a paired
    bootstrap 95% CI and a sign-flip p-value (cts/eval/score/metrics.paired_test). None when n = 0.
    `mde`: the smallest true difference that test detects with 80% power at α = 0.05
    (two-sided), given the n and the variance of the per-instance differences
    (cts/eval/score/power.py; the report's gains take theirs the same way); None below two
    instances, below the instances on which that test can reach p ≤ α at all (6: its p is
    never below 2/2^n), or when the differences do not vary. The rows are not a Holm family (no
    p here is adjusted), so every row's MDE is at α itself."""

    condition: str
    first: float | None
    second: float | None
    difference: float | None
    low: float | None
    high: float | None
    p_value: float | None
    n: int
    mde: float | None


@dataclass(frozen=True)
class Movement:
    """How far two judgements of the same answers move apart: the share of the paired nugget
    labels that differ, and the restore score points a paired record moves, |second − first|
    averaged over records; each with a 95% bootstrap CI that resamples instances (an
    instance's labels and records move together). Between two judgements by the same judge,
    this is the judge's noise floor: what re-reading alone moves. Shares and points are None
    when nothing was paired."""

    labels: int
    changed: int
    share: float | None
    share_low: float | None
    share_high: float | None
    #: Paired records with a restore score in both judgements.
    records: int
    #: Of those, the records whose score differs.
    records_moved: int
    points: float | None
    points_low: float | None
    points_high: float | None
    #: Instances the intervals resample.
    instances: int


def movement(pairing: Pairing, resamples: int = 10_000, seed: int = 0) -> Movement:
    """The labels and scores that move between the two judgements of `pairing`."""
    labels: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # instance → [changed, labels]
    for p in pairing.labels:
        labels[p.key[0]][0] += p.first != p.second
        labels[p.key[0]][1] += 1
    points: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # Σ|Δ|, moved, n
    for per_instance in pairing.scores.values():
        for instance, per_seed in per_instance.items():
            for first, second in per_seed.values():
                points[instance][0] += abs(second - first)
                points[instance][1] += first != second
                points[instance][2] += 1
    share = points_ci = None
    if labels:
        ids = sorted(labels)
        share = ratio_ci(
            [labels[i][0] for i in ids], [labels[i][1] for i in ids], resamples=resamples, seed=seed
        )
    if points:
        ids = sorted(points)
        points_ci = ratio_ci(
            [points[i][0] for i in ids], [points[i][2] for i in ids], resamples=resamples, seed=seed
        )
    return Movement(
        labels=sum(n for _, n in labels.values()),
        changed=sum(c for c, _ in labels.values()),
        share=share.mean if share else None,
        share_low=share.low if share else None,
        share_high=share.high if share else None,
        records=int(sum(v[2] for v in points.values())),
        records_moved=int(sum(v[1] for v in points.values())),
        points=points_ci.mean if points_ci else None,
        points_low=points_ci.low if points_ci else None,
        points_high=points_ci.high if points_ci else None,
        instances=len(set(labels) | set(points)),
    )


@dataclass(frozen=True)
class PairAgreement:
    first: str
    second: str
    keys: KeyAccount
    kappa: Kappa
    strict_kappa: Kappa
    confusion: Confusion
    strict_confusion: Confusion
    by_language: list[GroupAgreement]
    by_removed_constraint: list[GroupAgreement]
    #: Lowest agreement first.
    by_instance: list[InstanceAgreement]
    scores: list[ScoreDifference]
    mismatches: list[Mismatch]
    #: The labels and score points that move from the first judgement to the second.
    movement: Movement | None = None
    #: Each judgement's judge: its model label and its setup digest.
    judges: tuple[str, str] = ("?", "?")
    setups: tuple[str | None, str | None] = (None, None)
    #: Both judgements by one judge, which read the answers in each: the movement is that
    #: judge's noise floor.
    same_judge: bool = False
    #: Judgements by one judge where one of them is a response-cache replay (`cache_replay`):
    #: the run whose labels are replays, else None. Not a noise floor.
    replayed: str | None = None


def _groups(pairs: list[LabelPair], of: str) -> list[GroupAgreement]:
    found: dict[str, list[LabelPair]] = defaultdict(list)
    for p in pairs:
        for group in (p.language,) if of == "language" else p.removed_constraints:
            found[group].append(p)
    return [
        GroupAgreement(
            group,
            cohen_kappa([(p.first, p.second) for p in members]),
            cohen_kappa([(strict(p.first), strict(p.second)) for p in members], STRICT_LABELS),
        )
        for group, members in sorted(found.items())
    ]


def _instances(pairs: list[LabelPair]) -> list[InstanceAgreement]:
    found: dict[str, list[LabelPair]] = defaultdict(list)
    for p in pairs:
        found[p.key[0]].append(p)
    rows = [
        InstanceAgreement(
            instance, members[0].language, mean(p.first == p.second for p in members), len(members)
        )
        for instance, members in found.items()
    ]
    return sorted(rows, key=lambda r: (r.agreement, r.instance_id))


def _conditions(names: set[str]) -> list[str]:
    """The study's order (blurred, clarify@1..3, oracle), then any other."""
    known = [c for c in ALL_CONDITIONS if c in names]
    return known + sorted(names - set(known))


def _score_differences(pairing: Pairing, resamples: int, seed: int) -> list[ScoreDifference]:
    rows = []
    for condition in _conditions(set(pairing.scores)):
        per_instance = pairing.scores[condition]
        ids = sorted(per_instance)
        first = [mean(s[0] for s in per_instance[i].values()) for i in ids]
        second = [mean(s[1] for s in per_instance[i].values()) for i in ids]
        test = paired_test(second, first, resamples=resamples, seed=seed)
        differences = [b - a for a, b in zip(first, second, strict=True)]
        detectable = paired_mde(differences, resamples=resamples)
        rows.append(
            ScoreDifference(
                condition,
                mean(first),
                mean(second),
                test.mean_difference,
                test.low,
                test.high,
                test.p_value,
                test.n,
                detectable,
            )
        )
    return rows


def compare(
    first: Judgement, second: Judgement, resamples: int = 10_000, seed: int = 0
) -> PairAgreement:
    """Every figure of one pair of judgements (the first is the reference)."""
    pairing = pair(first, second)
    labels = [(p.first, p.second) for p in pairing.labels]
    one_judge = first.setup is not None and first.setup == second.setup
    replay = cache_replay(first, second, pairing) if one_judge else None
    strict_labels = [(strict(a), strict(b)) for a, b in labels]
    return PairAgreement(
        first=first.name,
        second=second.name,
        keys=pairing.account,
        kappa=cohen_kappa(labels),
        strict_kappa=cohen_kappa(strict_labels, STRICT_LABELS),
        confusion=confusion(labels),
        strict_confusion=confusion(strict_labels, STRICT_LABELS),
        by_language=_groups(pairing.labels, "language"),
        by_removed_constraint=_groups(pairing.labels, "removed_constraint"),
        by_instance=_instances(pairing.labels),
        scores=_score_differences(pairing, resamples, seed),
        mismatches=pairing.mismatches,
        movement=movement(pairing, resamples, seed),
        judges=(first.judge, second.judge),
        setups=(first.setup, second.setup),
        same_judge=one_judge and replay is None,
        replayed=replay,
    )


def cache_replay(first: Judgement, second: Judgement, pairing: Pairing) -> str | None:
    """The name of the judgement whose labels of every paired record came from the response
    cache (no judge call), when neither is a rejudge; else None. Such labels are an earlier
    run's answers to the same requests (the other's, for a rerun of it): comparing them with
    that run measures no re-reading. A rejudge never reads a shared cache (cts/eval/rejudge.py), so
    where either is one, the labels on both sides were read apart."""
    if first.source is not None or second.source is not None or not pairing.labels:
        return None
    keys = {p.key for p in pairing.labels}
    for judgement in (second, first):
        if all(replayed(judgement.records[k]) for k in keys):
            return judgement.name
    return None


# -- several runs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class System:
    """Judgements of one set of answers (one clarifier system), in the order given."""

    name: str
    judgements: list[str]


@dataclass(frozen=True)
class RankingChange:
    """Under one condition, the systems' mean restore scores under their first judgement and
    under their judgement number `judgement` (0-based, in the order given), and Kendall's τ-b
    between the two rankings (n: systems). Means are over the instances every system had
    judged under both (`instances`)."""

    condition: str
    judgement: int
    systems: list[str]
    first: list[float]
    second: list[float]
    tau: Tau
    instances: int


@dataclass(frozen=True)
class JudgementInfo:
    name: str
    path: str
    system: str
    judge: str
    source: str | None


@dataclass(frozen=True)
class NoiseFloor:
    """A judge's same-judge noise floor: the movement between two judgements it made of the
    same answers (`first`, `second`: the runs)."""

    judge: str
    setup: str
    first: str
    second: str
    movement: Movement


@dataclass(frozen=True)
class AgreementReport:
    judgements: list[JudgementInfo]
    systems: list[System]
    pairs: list[PairAgreement]
    rankings: list[RankingChange]
    #: What could not be compared, and why.
    notes: list[str]
    #: One per pair of judgements by the same judge.
    noise_floors: list[NoiseFloor] = field(default_factory=list)

    def floors_for(self, found: PairAgreement) -> list[NoiseFloor]:
        """The noise floors of the judges of a pair of judgements (by another judge each)."""
        return [f for f in self.noise_floors if f.setup in found.setups]


def noise_floors(
    pairs: Sequence[PairAgreement], paths: dict[str, Path] | None = None
) -> tuple[list[NoiseFloor], list[str]]:
    """The noise floor of each pair judged twice by one judge; a note for each judge compared
    with another that has none among the runs given (`paths`: each run's directory, by name)."""
    floors = [
        NoiseFloor(p.judges[0], p.setups[0], p.first, p.second, p.movement)
        for p in pairs
        if p.same_judge and p.setups[0] is not None and p.movement is not None
    ]
    measured = {f.setup for f in floors}
    missing: dict[str, tuple[str, str]] = {}  # setup → (judge, a run it judged)
    for p in pairs:
        if not p.same_judge:
            for judge, setup, run in zip(p.judges, p.setups, (p.first, p.second), strict=True):
                if setup is not None and setup not in measured:
                    missing.setdefault(setup, (judge, str((paths or {}).get(run, run))))
    notes = [
        f"judge {judge} (run {run}): no same-judge noise floor among the runs given, so its "
        "difference from another judge cannot be told from re-reading noise: rejudge that run "
        f"with the same judge (`cts rejudge {run} --output-dir {run}-again`) and give both"
        for judge, run in sorted(missing.values())
    ]
    return floors, notes


def same_answers(first: Judgement, second: Judgement) -> bool:
    """Judgements of the same answers: one re-judges the other (or both re-judge one run), or
    they share a key whose answer both judged and differ on none."""
    if _linked(first, second):
        return True
    common = [
        k
        for k in set(first.records) & set(second.records)
        if reached_judge(first.records[k]) and reached_judge(second.records[k])
    ]
    return bool(common) and all(first.records[k].answer == second.records[k].answer for k in common)


def _linked(first: Judgement, second: Judgement) -> bool:
    def where(path: Path | None) -> Path | None:
        return path.resolve() if path is not None else None

    a, b = where(first.path), where(second.path)
    sa, sb = where(first.source), where(second.source)
    return sa == b or sb == a or (sa is not None and sa == sb)


def systems_of(judgements: Sequence[Judgement]) -> list[list[int]]:
    """The judgements grouped by the answers they judge (union of `same_answers`), each group
    in the order given, groups in the order of their first judgement."""
    parent = list(range(len(judgements)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(len(judgements)):
        for j in range(i + 1, len(judgements)):
            if root(i) != root(j) and same_answers(judgements[i], judgements[j]):
                parent[max(root(i), root(j))] = min(root(i), root(j))
    groups: dict[int, list[int]] = defaultdict(list)
    for i in range(len(judgements)):
        groups[root(i)].append(i)
    return [groups[r] for r in sorted(groups)]


def rankings(
    judgements: Sequence[Judgement], systems: list[list[int]]
) -> tuple[list[RankingChange], list[str]]:
    """τ between the systems' rankings under their first and their j-th judgement, per
    condition, for every j all systems have; notes on what could not be ranked."""
    ranked = [g for g in systems if len(g) > 1]
    notes: list[str] = []
    if len(ranked) < 2:
        return [], notes
    depth = min(len(g) for g in ranked)
    if any(len(g) > depth for g in ranked):
        notes.append(
            f"systems have {sorted({len(g) for g in ranked})} judgements each: rankings compare "
            f"the first {depth} of every system"
        )
    changes = []
    for j in range(1, depth):
        pairings = [pair(judgements[g[0]], judgements[g[j]]) for g in ranked]
        conditions = set.intersection(*(set(p.scores) for p in pairings))
        for condition in _conditions(conditions):
            ids = set.intersection(*(set(p.scores[condition]) for p in pairings))
            if not ids:
                notes.append(f"{condition}: no instance judged under every system, not ranked")
                continue
            first, second = [], []
            for p in pairings:
                per_instance = p.scores[condition]
                first.append(mean(mean(s[0] for s in per_instance[i].values()) for i in ids))
                second.append(mean(mean(s[1] for s in per_instance[i].values()) for i in ids))
            changes.append(
                RankingChange(
                    condition,
                    j,
                    [judgements[g[0]].system for g in ranked],
                    first,
                    second,
                    kendall_tau(first, second),
                    len(ids),
                )
            )
    return changes, notes


def agreement(
    judgements: Sequence[Judgement], resamples: int = 10_000, seed: int = 0
) -> AgreementReport:
    """Every pair of judgements of the same answers compared; with several systems, the
    ranking change per condition. Judgements of answers no other one judges are noted."""
    groups = systems_of(judgements)
    notes = []
    pairs = []
    for group in groups:
        if len(group) == 1:
            alone = judgements[group[0]]
            notes.append(
                f"{alone.name}: no other run given judges the same answers (a rejudge of it, "
                "or a run whose answers equal its own on every key both judged)"
            )
        for n, i in enumerate(group):
            for j in group[n + 1 :]:
                pairs.append(compare(judgements[i], judgements[j], resamples, seed))
    changes, ranking_notes = rankings(judgements, groups)
    floors, floor_notes = noise_floors(pairs, {j.name: j.path for j in judgements})
    notes += [
        f"{p.first} vs {p.second}: the same judge, but every label of {p.replayed} on the "
        "answers both judged came from the response cache (no judge call): replays of earlier "
        "answers to the same requests, not a second reading, so the pair is no noise floor "
        "(`cts rejudge` asks the judge again)"
        for p in pairs
        if p.replayed is not None
    ]
    return AgreementReport(
        judgements=[
            JudgementInfo(
                j.name, str(j.path), j.system, j.judge, str(j.source) if j.source else None
            )
            for j in judgements
        ],
        systems=[System(judgements[g[0]].system, [judgements[i].name for i in g]) for g in groups],
        pairs=pairs,
        rankings=changes,
        notes=notes + ranking_notes + floor_notes,
        noise_floors=floors,
    )


def names_for(paths: Sequence[Path]) -> list[str]:
    """How tables name each run: its directory's name, or its path where two share a name."""
    names = [p.name for p in paths]
    return [p.name if names.count(p.name) == 1 else str(p) for p in paths]
