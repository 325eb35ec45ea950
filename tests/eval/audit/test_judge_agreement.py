"""`cts judge agreement`: Cohen's κ, the confusion matrix and Kendall's τ against hand
computations on small tables; pairing on (instance, condition, seed, nugget) with mismatches
listed, not joined; score differences and ranking changes; a run against its rejudge end to
end."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.audit.agreement import agreement, compare, systems_of
from cts.eval.audit.pairing import Judgement, pair, read_judgement
from cts.eval.data.schema import Record
from cts.eval.run.records import RecordStore
from cts.eval.score.kappa import STRICT_LABELS, cohen_kappa, confusion, kendall_tau, strict
from cts.eval.score.power import mde
from cts.serving.scripted import scripted_roles
from tests.eval.test_rejudge import NEW_JUDGE, make_source, rejudge

# A 3×3 table of 14 nugget labels (rows: judge A, columns: judge B):
#
#             B full  B partial  B none | A's total
#   A full       4        1        0    |   5
#   A partial    1        2        1    |   4
#   A none       0        1        4    |   5
#   B's total    5        4        5    |  14
#
# p_o = (4 + 2 + 4) / 14 = 10/14
# p_e = (5·5 + 4·4 + 5·5) / 14² = 66/196
# κ   = (10/14 − 66/196) / (1 − 66/196) = (140 − 66) / (196 − 66) = 74/130 ≈ 0.5692
#
# Strict (full vs rest): A full 5, rest 9; B full 5, rest 9; agreeing: full-full 4 and
# rest-rest 2 + 1 + 1 + 4 = 8, so p_o = 12/14; p_e = (5·5 + 9·9)/196 = 106/196;
# κ = (168 − 106) / (196 − 106) = 62/90 ≈ 0.6889.
TABLE = {
    ("full", "full"): 4,
    ("full", "partial"): 1,
    ("partial", "full"): 1,
    ("partial", "partial"): 2,
    ("partial", "none"): 1,
    ("none", "partial"): 1,
    ("none", "none"): 4,
}
PAIRS = [pair for pair, count in TABLE.items() for _ in range(count)]


def test_cohen_kappa_and_confusion_match_the_hand_computation():
    kappa = cohen_kappa(PAIRS)
    assert kappa.n == 14
    assert kappa.observed == pytest.approx(10 / 14)
    assert kappa.expected == pytest.approx(66 / 196)
    assert kappa.kappa == pytest.approx(74 / 130)
    strict_kappa = cohen_kappa([(strict(a), strict(b)) for a, b in PAIRS], STRICT_LABELS)
    assert strict_kappa.observed == pytest.approx(12 / 14)
    assert strict_kappa.kappa == pytest.approx(62 / 90)
    table = confusion(PAIRS)
    assert table.labels == ("full", "partial", "none") and table.n == 14
    assert table.counts == [[4, 1, 0], [1, 2, 1], [0, 1, 4]]


def test_kappa_edge_cases_say_so_instead_of_inventing_a_number():
    # Both judges always say `none`: p_o = 1, p_e = 1 → κ undefined, not 1 nor 0.
    same = cohen_kappa([("none", "none")] * 5)
    assert (same.kappa, same.observed, same.expected, same.n) == (None, 1.0, 1.0, 5)
    assert cohen_kappa([]).n == 0 and cohen_kappa([]).kappa is None
    # Perfect agreement with two labels used: κ = 1. Total disagreement on a 50/50 split:
    # p_o = 0, p_e = 0.5·0.5 + 0.5·0.5 = 0.5 → κ = (0 − 0.5)/(1 − 0.5) = −1.
    assert cohen_kappa([("full", "full"), ("none", "none")]).kappa == pytest.approx(1.0)
    assert cohen_kappa([("full", "none"), ("none", "full")]).kappa == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="maybe"):
        cohen_kappa([("full", "maybe")])


def test_kendall_tau_matches_the_hand_computation():
    # [1,2,3,4] vs [1,3,2,4]: of the 6 pairs only (2nd, 3rd) swaps: C = 5, D = 1,
    # τ = (5 − 1)/6 = 2/3.
    tau = kendall_tau([1, 2, 3, 4], [1, 3, 2, 4])
    assert (tau.concordant, tau.discordant, tau.n) == (5, 1, 4)
    assert tau.tau == pytest.approx(2 / 3)
    # Ties, τ-b: [1,1,2] vs [1,2,3]: pair (1st, 2nd) tied in the first only; the other two
    # concordant. P = 3, T_a = 1, T_b = 0: τ_b = (2 − 0)/√((3 − 1)(3 − 0)) = 2/√6 ≈ 0.8165.
    tied = kendall_tau([1, 1, 2], [1, 2, 3])
    assert (tied.concordant, tied.discordant, tied.ties_first, tied.ties_second) == (2, 0, 1, 0)
    assert tied.tau == pytest.approx(2 / math.sqrt(6))
    assert kendall_tau([3, 2, 1], [1, 2, 3]).tau == pytest.approx(-1.0)
    assert kendall_tau([5, 5], [1, 2]).tau is None  # one ranking ties everything
    assert kendall_tau([1], [1]).tau is None


def record(
    instance: str,
    condition: str,
    labels: dict[str, str] | None,
    answer: str = "an answer",
    score: float | None = None,
    error: dict[str, str] | None = None,
    language: str = "en",
    removed: tuple[str, ...] = ("region",),
) -> Record:
    return Record(
        instance_id=instance,
        condition=condition,
        seed=0,
        language=language,
        removed_constraints=list(removed),
        answer=answer,
        labels={n: {"label": v, "evidence": ""} for n, v in (labels or {}).items()},
        scores={} if score is None else {"restore_score_100": score},
        error=error,
    )


def judgement(
    name: str,
    records: list[Record],
    system: str = "s",
    source: str | None = None,
    setup: str | None = None,
    judge: str = "judge",
):
    return Judgement(
        name,
        Path(name),
        system,
        judge,
        Path(source) if source else None,
        {r.key: r for r in records},
        setup,
    )


def test_pairs_join_only_the_same_answers_and_nuggets_and_list_the_rest():
    search_failed = {"kind": "server_error", "stage": "search", "message": "x"}
    judge_failed = {"kind": "invalid_output", "stage": "judge", "message": "x"}
    a = judgement(
        "a",
        [
            record("i1", "blurred", {"n1": "full", "n2": "none"}, score=50),
            record("i2", "blurred", {"n1": "partial"}, answer="one answer", score=50),
            record("i3", "blurred", {"n1": "full", "n2": "full"}, score=100),
            record("i4", "blurred", None, error=search_failed),
            record("i5", "blurred", None, error=judge_failed),
            record("i6", "blurred", {"n1": "full"}, score=100),
            record("i7", "blurred", {"n1": "none"}, score=0),
        ],
    )
    b = judgement(
        "b",
        [
            record("i1", "blurred", {"n1": "full", "n2": "partial"}, score=75),
            record("i2", "blurred", {"n1": "full"}, answer="another answer", score=100),
            record("i3", "blurred", {"n1": "full", "n3": "full"}, score=100),
            record("i4", "blurred", None, error=search_failed),
            record("i5", "blurred", {"n1": "none"}, score=0),
            record("i6", "blurred", None, error=search_failed),
            record("i8", "blurred", {"n1": "none"}, score=0),
        ],
    )
    found = pair(a, b)
    account = found.account
    assert (account.paired, account.failed_both, account.judge_failed_first) == (1, 1, 1)
    assert (account.only_first, account.only_second, account.mismatched) == (1, 1, 3)
    why = {m.key[0]: m.why for m in found.mismatches}
    assert why["i2"] == "the answers differ"
    assert why["i3"] == "the nuggets differ: only in a ['n2'], only in b ['n3']"
    assert why["i6"] == "failed before the judge in b only (search: server_error)"
    # Only i1's two nuggets are compared.
    assert [(p.nugget, p.first, p.second) for p in found.labels] == [
        ("n1", "full", "full"),
        ("n2", "none", "partial"),
    ]
    assert found.scores == {"blurred": {"i1": {0: (50, 75)}}}


def test_score_differences_topics_and_instances_carry_their_n():
    first, second = [], []
    for n, (a, b) in enumerate([(40.0, 50.0), (60.0, 70.0), (20.0, 30.0)]):
        language = "zh" if n == 2 else "en"
        removed = ("time", "region") if n == 0 else ("region",)
        first.append(
            record(
                f"i{n}",
                "oracle",
                {"n1": "full", "n2": "none"},
                score=a,
                language=language,
                removed=removed,
            )
        )
        second.append(
            record(
                f"i{n}",
                "oracle",
                {"n1": "full", "n2": "full" if n else "none"},
                score=b,
                language=language,
                removed=removed,
            )
        )
    found = compare(judgement("a", first), judgement("b", second), resamples=1000)
    (oracle,) = found.scores
    # Every instance gains 10 points: the mean difference and its whole CI are 10.
    assert (oracle.condition, oracle.n) == ("oracle", 3)
    assert (oracle.first, oracle.second) == pytest.approx((40.0, 50.0))
    assert (oracle.difference, oracle.low, oracle.high) == pytest.approx((10.0, 10.0, 10.0))
    assert oracle.p_value == pytest.approx(2 / 8)  # exact: 2 of the 2³ sign flips as extreme
    assert oracle.mde is None  # the differences do not vary: no variance to scale an MDE by
    languages = {g.group: g.kappa.n for g in found.by_language}
    assert languages == {"en": 4, "zh": 2}
    constraints = {g.group: g.kappa.n for g in found.by_removed_constraint}
    assert constraints == {"region": 6, "time": 2}  # i0 counts under both of its types
    assert [(i.instance_id, i.agreement, i.n) for i in found.by_instance] == [
        ("i1", 0.5, 2),
        ("i2", 0.5, 2),
        ("i0", 1.0, 2),
    ]
    assert found.confusion.counts == [[3, 0, 0], [0, 0, 0], [2, 0, 1]]


def test_each_score_difference_has_the_mde_of_its_per_instance_differences():
    """Two seeds, each instance's seeds averaged first (as the report's gains do). Scores
    (first judgement → second) per seed: i0 (40, 44) → (50, 58), i1 (60, 60) → (62, 62),
    i2 (20, 30) → (35, 33), i3 (10, 10) → (14, 18), i4 (70, 74) → (70, 74), i5 (30, 34) →
    (40, 42). Per-instance differences of seed means: 54 − 42 = 12, 2, 34 − 25 = 9, 16 − 10 = 6,
    0, 41 − 32 = 9; mean 38/6 = 19/3, variance (346 − 6 · (19/3)²) / 5 = 316/15 on n = 6."""
    scores = {
        "i0": [(40, 50), (44, 58)],
        "i1": [(60, 62), (60, 62)],
        "i2": [(20, 35), (30, 33)],
        "i3": [(10, 14), (10, 18)],
        "i4": [(70, 70), (74, 74)],
        "i5": [(30, 40), (34, 42)],
    }
    first, second = [], []
    for instance, per_seed in scores.items():
        for seed, (a, b) in enumerate(per_seed):
            for side, score in ((first, a), (second, b)):
                made = record(instance, "clarify@1", {"n1": "full"}, score=float(score))
                side.append(made.model_copy(update={"seed": seed}))
    (row,) = compare(judgement("a", first), judgement("b", second), resamples=1000).scores
    assert (row.n, row.difference) == (6, pytest.approx(19 / 3))
    assert row.mde == pytest.approx(mde(316 / 15, 6))
    # By hand: at n = 6 (df 5) the t test needs (t_.975 + t_.8) · sd / √n at least, about
    # (2.571 + 0.920) · √(316/90) = 6.54 points; the noncentral t asks slightly more.
    assert row.mde is not None and 6.54 < row.mde < 6.7
    # The first three instances alone: the sign-flip p is never below 2/2³ = 0.25, no MDE.
    three = [r for r in first if r.instance_id in ("i0", "i1", "i2")]
    again = [r for r in second if r.instance_id in ("i0", "i1", "i2")]
    (row,) = compare(judgement("a", three), judgement("b", again), resamples=1000).scores
    assert row.n == 3 and row.mde is None


def test_systems_are_told_apart_by_their_answers_and_their_rankings_compared():
    """Three systems, each judged twice. Means under judge 1: X 50 > Y 40 > Z 30; under judge 2:
    Y 48 > X 45 > Z 20. Pairs: (X, Y) discordant, (X, Z) and (Y, Z) concordant:
    τ = (2 − 1)/3 = 1/3."""
    scores = {"X": (50.0, 45.0), "Y": (40.0, 48.0), "Z": (30.0, 20.0)}
    runs = []
    for system, (one, two) in scores.items():
        for judge, score in (("1", one), ("2", two)):
            runs.append(
                judgement(
                    f"{system}{judge}",
                    [
                        # blurred is shared by every system (the cache replays it) ...
                        record("i1", "blurred", {"n1": "none"}, answer="shared", score=0),
                        # ... but each system's clarify@1 answer is its own.
                        record("i1", "clarify@1", {"n1": "full"}, answer=system, score=score),
                    ],
                    system=system,
                )
            )
    assert systems_of(runs) == [[0, 1], [2, 3], [4, 5]]
    report = agreement(runs, resamples=100)
    assert [s.judgements for s in report.systems] == [["X1", "X2"], ["Y1", "Y2"], ["Z1", "Z2"]]
    assert len(report.pairs) == 3 and not report.notes
    by_condition = {r.condition: r for r in report.rankings}
    assert by_condition["clarify@1"].tau.tau == pytest.approx(1 / 3)
    assert by_condition["clarify@1"].systems == ["X", "Y", "Z"]
    assert (by_condition["clarify@1"].tau.n, by_condition["clarify@1"].instances) == (3, 1)
    assert by_condition["blurred"].tau.tau is None  # every system ties at 0 under both


def test_a_rejudge_is_paired_with_its_source_even_where_answers_differ():
    a = judgement("a", [record("i1", "blurred", {"n1": "full"}, score=100)])
    b = judgement(
        "b", [record("i1", "blurred", {"n1": "none"}, answer="edited", score=0)], source="a"
    )
    c = judgement("c", [record("i1", "blurred", {"n1": "none"}, answer="edited", score=0)])
    assert systems_of([a, b]) == [[0, 1]]  # rejudge.json links them
    assert systems_of([a, c]) == [[0], [1]]  # nothing does
    report = agreement([a, c])
    assert report.pairs == [] and len(report.notes) == 2
    linked = agreement([a, b]).pairs[0]
    assert linked.keys.mismatched == 1 and linked.kappa.n == 0


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """A scripted run, its rejudge by another judge and its rejudge by the same judge."""
    source = make_source(tmp_path, monkeypatch)
    rejudge(source, tmp_path / "other", monkeypatch, NEW_JUDGE)
    rejudge(source, tmp_path / "same", monkeypatch, [], judge=scripted_roles()["judge"].script)
    return source, tmp_path / "other", tmp_path / "same"


def test_a_run_against_its_rejudge(runs, tmp_path):
    source, other, same = runs
    out = tmp_path / "agreement.json"
    result = CliRunner().invoke(
        app, ["judge", "agreement", str(source), str(other), str(same), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "confusion (n " in result.output and "Kendall" not in result.output
    figures = json.loads(out.read_text())
    assert [s["judgements"] for s in figures["systems"]] == [["source", "other", "same"]]
    pairs = {(p["first"], p["second"]): p for p in figures["pairs"]}
    assert set(pairs) == {("source", "other"), ("source", "same"), ("other", "same")}

    old = RecordStore(source).completed()
    new = RecordStore(other).completed()
    both = [k for k in old if old[k].labels and new[k].labels and not old[k].error]
    expected = [
        (old[k].labels[n]["label"], new[k].labels[n]["label"]) for k in both for n in old[k].labels
    ]
    versus_other = pairs[("source", "other")]
    kappa = cohen_kappa(expected)
    assert versus_other["kappa"]["n"] == kappa.n == len(expected) > 0
    assert versus_other["kappa"]["kappa"] == pytest.approx(kappa.kappa)
    assert sum(map(sum, versus_other["confusion"]["counts"])) == len(expected)
    keys = versus_other["keys"]
    copied = sum(1 for r in old.values() if r.error and r.error["stage"] != "judge")
    judge_failed = sum(1 for r in old.values() if r.error and r.error["stage"] == "judge")
    assert (keys["paired"], keys["failed_both"]) == (len(both), copied)
    assert (keys["judge_failed_first"], keys["mismatched"]) == (judge_failed, 0)
    assert {row["condition"] for row in versus_other["scores"]} == {
        "blurred",
        "clarify@1",
        "clarify@2",
        "oracle",
    }
    # Each row's MDE stands on the variance of its per-instance differences (seeds averaged).
    assert "MDE" in result.output
    for row in versus_other["scores"]:
        scored = [k for k in both if k[1] == row["condition"] and new[k].scores]
        by_instance: dict[str, list[float]] = {}
        for k in scored:
            moved = new[k].scores["restore_score_100"] - old[k].scores["restore_score_100"]
            by_instance.setdefault(k[0], []).append(moved)
        differences = [sum(v) / len(v) for v in by_instance.values()]
        assert row["n"] == len(differences)
        spread = len(differences) > 1 and len(set(differences)) > 1
        expected_mde = mde(statistics.variance(differences), len(differences)) if spread else None
        assert row["mde"] == pytest.approx(expected_mde)
    # At most 2 instances a row (of 3, some failed): the sign-flip p is never below 2/2² = 0.5,
    # so no row has an MDE, and the table says why.
    assert all(row["n"] <= 2 and row["mde"] is None for row in versus_other["scores"])
    assert "– (n too small)" in result.output
    # The same judge asked again agrees with itself (the scripted judge is deterministic).
    versus_same = pairs[("source", "same")]
    assert versus_same["kappa"]["observed"] == 1.0 and versus_same["kappa"]["kappa"] == 1.0
    assert all(row["difference"] == 0 for row in versus_same["scores"])
    assert all(row["mde"] is None for row in versus_same["scores"])  # shown "–"


def test_runs_of_other_answers_are_reported_not_joined(runs, tmp_path):
    source, other, _ = runs
    edited = tmp_path / "edited"
    shutil.copytree(source, edited)
    for path in RecordStore(edited).all_files():
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for line in lines:
            line["answer"] = "something else"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = CliRunner().invoke(app, ["judge", "agreement", str(other), str(edited)])
    assert result.exit_code == 1
    assert "no other run given judges the same answers" in result.output
    assert "nothing compared" in result.output
    assert read_judgement(edited).source is None
    one = CliRunner().invoke(app, ["judge", "agreement", str(source)])
    assert one.exit_code == 2 and "at least two" in one.output


def test_a_rejudge_whose_rejudge_json_is_damaged_is_an_error_naming_it(tmp_path):
    """`cts judge agreement` read rejudge.json unguarded: a damaged one was a traceback."""
    import shutil

    from cts.eval.audit.pairing import read_judgement
    from cts.eval.run.config import load_experiment
    from cts.eval.run.run_dir import RunDir, RunDirError

    run = RunDir(tmp_path / "rejudged")
    run.write_config(load_experiment(None, []))
    for damaged in ('{"source": {"path": ', "[]", "{}"):
        run.provenance.write_text(damaged)
        with pytest.raises(RunDirError, match=r"rejudge.json: unreadable .* cannot tell which"):
            read_judgement(run.root)
    shutil.rmtree(run.root)
