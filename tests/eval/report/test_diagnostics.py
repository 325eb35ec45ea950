"""The report's numbers against hand computations: n and failures in every cell, paired
comparisons, the failure policy, guarded gain recovered, the study's diagnostics, and systems
compared pairwise."""

from __future__ import annotations

import asyncio
import json
from statistics import mean

import pytest

from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Record
from cts.eval.report.diagnostics import (
    compare_systems,
    judge_labels,
    paired_instances,
    score_records,
    summarize,
)
from cts.eval.report.dialogue_diagnostics import clarification, score_by_answered
from cts.eval.report.html import to_html
from cts.eval.report.markdown import markdown
from cts.eval.report.report import write_report
from cts.eval.report.summary import Score, SystemSummary
from cts.eval.run.config import load_experiment
from cts.eval.run.pipeline import run_instance
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import Shard
from cts.eval.run.runner import run_keys
from cts.eval.score.metrics import holm, paired_test
from cts.serving.errors import EngineUnavailable
from tests.scripted import scripted_context

CONDITIONS = ["blurred", "clarify@1", "oracle"]


def rec(instance: str, condition: str, score: float | None, seed: int = 0, **fields) -> Record:
    scores = (
        {"restore_score_100": score, "strict": score / 2, "unweighted": score}
        if score is not None
        else {}
    )
    return Record(instance_id=instance, condition=condition, seed=seed, scores=scores, **fields)


def asked(
    instance: str, condition: str, score: float, *turns: tuple[str, str, list[str]]
) -> Record:
    """A clarify record from its (question, answer, question types) turns, one a line."""
    return rec(
        instance,
        condition,
        score,
        questions=[q for q, _, _ in turns],
        answers=[a for _, a, _ in turns],
        question_types=[t for _, _, t in turns],
    )


FAILED = {"kind": "engine_unavailable", "stage": "rewrite", "message": "down"}


def test_a_failure_excludes_its_instance_from_every_comparison():
    records = [
        *(rec(i, "blurred", s) for i, s in (("a", 40), ("b", 60), ("c", 20))),
        rec("a", "clarify@1", 50),
        rec("b", "clarify@1", None, error=FAILED),
        rec("c", "clarify@1", 30),
        *(rec(i, "oracle", s) for i, s in (("a", 80), ("b", 90), ("c", 60))),
    ]
    scored = score_records(records, CONDITIONS, [0], "exclude")
    ids = paired_instances([(scored, CONDITIONS)])
    assert ids == ["a", "c"]
    summary = summarize(records, CONDITIONS, [0], ids, scored)
    blurred = summary["scores"]["blurred"]
    # The blurred mean stands on a and c only, although b's blurred run was scored.
    assert blurred["n"] == 2 and blurred["restore_score_100"]["mean"] == 30.0
    assert summary["scores"]["clarify@1"]["failed"] == 1 and blurred["failed"] == 0
    assert summary["excluded_instances"] == {
        "b": ["clarify@1 seed 0: failed at rewrite (engine_unavailable)"]
    }
    gain = summary["gains"]["clarify@1"]
    assert gain["gain_over_blurred"] == 10.0 and gain["n"] == 2
    # (40 − 30) / (70 − 30), on the same two instances.
    assert gain["gain_recovered"]["value"] == pytest.approx(0.25)
    typed = SystemSummary.model_validate(summary).gain("clarify@1")  # what a Python user reads
    assert typed is not None and typed.gain_recovered is not None
    assert (typed.gain_over_blurred, typed.n, typed.gain_recovered.value) == (10.0, 2, 0.25)
    assert SystemSummary.model_validate(summary).score("blurred") == Score(
        mean=30.0, low=20.0, high=40.0, n=2
    )
    assert summary["failures"] == {
        "total": 1,
        "by_condition": {"clarify@1": 1},
        "by_stage": {"rewrite": 1},
        "by_kind": {"engine_unavailable": 1},
        "tool_errors": {"total": 0, "records": 0},
    }


def test_the_zero_policy_scores_a_failure_0_and_keeps_its_instance():
    records = [
        rec("a", "blurred", 40),
        rec("b", "blurred", 60),
        rec("a", "clarify@1", 50),
        rec("b", "clarify@1", None, error=FAILED),
    ]
    conditions = ["blurred", "clarify@1"]
    scored = score_records(records, conditions, [0], "zero")
    ids = paired_instances([(scored, conditions)])
    summary = summarize(records, conditions, [0], ids, scored, policy="zero")
    assert ids == ["a", "b"] and not summary["excluded_instances"]
    assert summary["scores"]["clarify@1"]["restore_score_100"]["mean"] == 25.0
    assert summary["gains"]["clarify@1"]["gain_over_blurred"] == -25.0


def test_seeds_average_per_instance_and_a_missing_seed_excludes_it():
    records = [
        rec("a", "blurred", 40, seed=0),
        rec("a", "blurred", 60, seed=1),
        rec("b", "blurred", 10, seed=0),
    ]
    scored = score_records(records, ["blurred"], [0, 1], "exclude")
    assert scored.values["blurred"] == {
        "a": {"restore_score_100": 50.0, "strict": 25.0, "unweighted": 50.0}
    }
    assert scored.problems == {"b": ["blurred seed 1: no record"]}


def test_gain_recovered_is_undefined_when_the_oracle_does_not_beat_blurred():
    # clarify 50, blurred 60, oracle 40: the unguarded ratio would be +0.5.
    records = [rec("a", "blurred", 60), rec("a", "clarify@1", 50), rec("a", "oracle", 40)]
    scored = score_records(records, CONDITIONS, [0], "exclude")
    summary = summarize(records, CONDITIONS, [0], ["a"], scored, min_gap=1.0)
    assert summary["gains"]["clarify@1"]["gain_recovered"] == {
        "undefined": True,
        "gap": -20.0,
        "min_gap": 1.0,
    }
    typed = SystemSummary.model_validate(summary).gain("clarify@1")
    assert typed is not None and typed.gain_recovered is not None
    assert typed.gain_recovered.undefined and typed.gain_recovered.value is None


def test_diagnostics_as_the_study_defines_them():
    unknown = "unknown"
    records = [
        # k = 1: one answered, one unknown.
        asked("a", "clarify@1", 40, ("q1", "2024", ["time"])),
        asked("b", "clarify@1", 10, ("q1", unknown, ["region"])),
        # k = 2: dialogue a answered then unknown; dialogue b unknown twice, both region.
        asked("a", "clarify@2", 50, ("q1", "2024", ["time"]), ("q2", unknown, ["region", "time"])),
        asked("b", "clarify@2", 20, ("q1", unknown, ["region"]), ("q2", unknown, ["region"])),
    ]
    c = clarification(records, "sequential")
    assert c["answerability_per_k"] == {"1": {"rate": 0.5, "n": 2}, "2": {"rate": 0.25, "n": 4}}
    assert c["answerability_per_turn"]["2"] == {
        "1": {"rate": 0.5, "n": 2},
        "2": {"rate": 0.0, "n": 2},
    }
    assert c["all_unknown_rate_per_k"]["2"] == {"rate": 0.5, "n": 2}
    # Sequential: the 4 distinct questions are the turns of the two 2-turn dialogues.
    assert c["questions"] == 4
    assert c["question_type_counts"]["region"] == 3 and c["question_type_counts"]["time"] == 2
    # The study's figure: b's two region-only questions, both unknown; any-region adds a's
    # region-and-time question (unknown too).
    assert c["region_only_unknown_rate"] == {
        "rate": 1.0,
        "unknown": 2,
        "n": 2,
        "study": "0.75–0.87",
    }
    assert c["any_region_unknown_rate"] == {"rate": 1.0, "unknown": 3, "n": 3}
    # Another figure: dialogues whose every question is about region (b's, not a's).
    assert c["all_region_interaction_rate"] == {"rate": 0.5, "n": 2}
    split = score_by_answered(records)
    assert split["2"]["some_answered"] == {"mean": 50.0, "records": 1}
    assert split["2"]["all_unknown"] == {"mean": 20.0, "records": 1}
    # All at once: each k's questions are its own.
    assert clarification(records, "all_at_once")["questions"] == 6


def test_the_region_figure_is_the_unknown_rate_of_region_only_questions():
    """Hand computation, sequential mode (each dialogue counted once, by its longest record).
    Region-only questions: a q1 (answered), b q1 and q2 (unknown), c q1 (answered): 2 unknown
    of 4. Any-region adds a q2 and c q2 (time and region, both answered): 2 unknown of 6. d
    asks about time only."""
    unknown = "unknown"
    region, region_time, time = ["region"], ["time", "region"], ["time"]
    records = [
        asked("a", "clarify@2", 0, ("q1", "Lyon", region), ("q2", "2024 in Lyon", region_time)),
        # a's clarify@1 is the first turn of the same dialogue: not counted again.
        asked("a", "clarify@1", 0, ("q1", "Lyon", region)),
        asked("b", "clarify@2", 0, ("q1", unknown, region), ("q2", unknown, region)),
        asked("c", "clarify@2", 0, ("q1", "Oslo", region), ("q2", "in Oslo", region_time)),
        asked("d", "clarify@2", 0, ("q1", unknown, time), ("q2", "2023", time)),
    ]
    c = clarification(records, "sequential")
    assert c["region_only_unknown_rate"] == {
        "rate": 2 / 4,
        "unknown": 2,
        "n": 4,
        "study": "0.75–0.87",
    }
    assert c["any_region_unknown_rate"] == {"rate": 2 / 6, "unknown": 2, "n": 6}
    conditions = ["clarify@1", "clarify@2"]
    scored = score_records(records, conditions, [0], "exclude")
    summary = summarize(records, conditions, [0], ["a"], scored)
    text = markdown([("sys", summary)], [], 1, "exclude")
    assert (
        "**Unknown rate of region-only questions** (the study's region figure): 50% (2 unknown "
        "of 4 questions whose only type is region); the study: 0.75–0.87." in text
    )
    assert (
        "Unknown rate of any-region questions: 33% (2 unknown of 6 questions with region among "
        "their types)." in text
    )
    page = to_html(text, [])
    assert "<li><strong>Unknown rate of region-only questions</strong> (the study" in page
    assert "50% (2 unknown of 4 questions whose only type is region)" in page
    none_asked = clarification([asked("d", "clarify@1", 0, ("q", "x", time))])
    assert none_asked["region_only_unknown_rate"]["rate"] is None
    lines = markdown([("sys", {**summary, "clarification": none_asked})], [], 1, "exclude")
    assert "no questions whose only type is region asked" in lines


def test_breakdowns_per_language_and_removed_constraint():
    records = [
        rec(i, c, s, language=lang, removed_constraints=removed)
        for i, lang, removed, scores in (
            ("a", "en", ["time"], (10, 30)),
            ("b", "zh", ["time", "region"], (20, 60)),
            ("c", "zh", [], (30, 30)),
        )
        for c, s in zip(["blurred", "clarify@1"], scores, strict=True)
    ]
    conditions = ["blurred", "clarify@1"]
    scored = score_records(records, conditions, [0], "exclude")
    summary = summarize(records, conditions, [0], ["a", "b", "c"], scored)
    by = summary["breakdowns"]
    assert by["language"]["zh"] == {"n": 2, "blurred": 25.0, "clarify@1": 45.0}
    assert by["removed_constraint"]["time"] == {"n": 2, "blurred": 15.0, "clarify@1": 45.0}
    assert by["removed_constraint"]["none"]["n"] == 1


def test_a_degenerate_judge_is_flagged():
    labels = {f"n{i}": {"label": "none", "evidence": ""} for i in range(19)}
    one = rec("a", "blurred", 0, labels=labels)
    assert judge_labels([one])["degenerate"]
    mixed = {**labels, "n19": {"label": "full", "evidence": ""}, "n20": {"label": "full"}}
    assert not judge_labels([rec("a", "blurred", 0, labels=mixed)])["degenerate"]


def test_systems_are_compared_on_common_instances_with_holm_across_k():
    first = [rec(i, c, 50 + n) for n, i in enumerate("abcd") for c in ("clarify@1", "clarify@2")]
    second = [rec(i, c, 40) for i in "abc" for c in ("clarify@1", "clarify@2")]
    conditions = ["clarify@1", "clarify@2"]
    systems = [
        ("A", score_records(first, conditions, [0], "exclude")),
        ("B", score_records(second, conditions, [0], "exclude")),
    ]
    rows = compare_systems(systems, conditions)
    assert [(r["condition"], r["n"]) for r in rows] == [("clarify@1", 3), ("clarify@2", 3)]
    expected = paired_test([50.0, 51.0, 52.0], [40.0, 40.0, 40.0])
    assert rows[0]["difference"] == pytest.approx(mean([10, 11, 12]))
    assert rows[0]["p_value"] == expected.p_value
    assert (
        rows[0]["p_holm"]
        == holm({"clarify@1": expected.p_value, "clarify@2": expected.p_value})["clarify@1"]
    )


def test_systems_are_compared_on_the_given_instances_only():
    """With `ids` (the loop table's paired instances) only those both systems scored count:
    a, b of a-d (e scored by neither): differences 10, 11, mean 10.5, n 2; the sign-flip p
    over the 4 flips of 2 instances is 2/4; without `ids` all 4: mean of 10..13, 11.5."""
    from cts.eval.score.power import paired_mde

    first = [rec(i, "clarify@1", 50 + n) for n, i in enumerate("abcd")]
    second = [rec(i, "clarify@1", 40) for i in "abcd"]
    systems = [
        ("A", score_records(first, ["clarify@1"], [0], "exclude")),
        ("B", score_records(second, ["clarify@1"], [0], "exclude")),
    ]
    (row,) = compare_systems(systems, ["clarify@1"], ids=["a", "b", "e"])
    assert (row["n"], row["difference"], row["p_value"]) == (2, 10.5, 0.5)
    assert row["p_holm"] == 0.5  # a family of one
    assert row["mde"] == paired_mde([10.0, 11.0], 0.05)
    (every,) = compare_systems(systems, ["clarify@1"])
    assert (every["n"], every["difference"]) == (4, 11.5)
    assert compare_systems(systems, ["clarify@1"], ids=["e"]) == []


def test_a_report_of_a_run_with_one_failing_instance_under_one_condition(search, tmp_path):
    """A scripted engine fails one chosen instance under clarify@2 only: the report shows n and
    the failure in every cell, warns with counts by stage and kind, lists the excluded
    instance, and pairs every comparison on the others."""
    data = load_instances(DatasetSource(path="sample", split="dev", limit=4))
    victim = data[1]
    ctx, roles = scripted_context(search)
    rewrite = roles["rewriter"].script

    def failing(request):  # type: ignore[no-untyped-def]
        content = request.messages[-1].content
        if victim.blurred_query in content and "Q2" in content:
            return EngineUnavailable("http://gpu3:8000/v1: connection refused")
        return rewrite(request)

    roles["rewriter"].script = failing
    conditions = ["blurred", "clarify@1", "clarify@2", "oracle"]
    resolved = load_experiment(None, [f"conditions={json.dumps(conditions)}", "dataset.limit=4"])
    for name in ("one", "two"):
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "config.yaml").write_text(resolved.to_yaml())
        asyncio.run(
            run_keys(
                data,
                conditions,
                [0],
                lambda i, c, s: run_instance(i, c, s, ctx),
                RecordStore(run_dir),
                Shard(),
            )
        )
    paths = write_report([tmp_path / "one"], tmp_path / "one")
    document = json.loads(paths.summary_json.read_text())
    assert document["report"]["paired_instances"] == 3
    (system,) = document["systems"].values()
    assert system["excluded_instances"] == {
        victim.id: ["clarify@2 seed 0: failed at rewrite (engine_unavailable)"]
    }
    assert system["scores"]["clarify@2"]["failed"] == 1
    assert all(system["scores"][c]["n"] == 3 for c in conditions)
    text = paths.markdown.read_text()
    assert "WARNING quickstart (smollm2-135m-instruct): 1 of 16 records failed" in text
    assert "by stage: rewrite 1; by kind: engine_unavailable 1" in text
    assert "(n=3, 1 failed)" in text and "paired" in text.lower()

    zero = write_report([tmp_path / "one"], tmp_path / "zero", failures="zero")
    (system,) = json.loads(zero.summary_json.read_text())["systems"].values()
    assert system["scores"]["clarify@2"]["n"] == 4
    assert "(n=4, 1 failed (scored 0))" in zero.markdown.read_text()

    both = write_report([tmp_path / "one", tmp_path / "two"], tmp_path / "both")
    document = json.loads(both.summary_json.read_text())
    assert len(document["comparisons"]) == 4
    assert {r["condition"]: r["n"] for r in document["comparisons"]}["clarify@1"] == 4
    assert "## Systems compared" in both.markdown.read_text()


def write_run(run_dir, records: list[Record], overrides: list[str]) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(load_experiment(None, overrides).to_yaml())
    store = RecordStore(run_dir)
    for r in records:
        store.append(r, Shard())


def test_cts_report_compares_two_runs_and_checks_its_options(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cts.cli import app

    monkeypatch.setenv("COLUMNS", "250")
    conditions = ["blurred", "clarify@1", "oracle"]
    first = [
        rec(i, c, s)
        for i, b in (("a", 10), ("b", 20), ("c", 30))
        for c, s in zip(conditions, (b, b + 10, b + 40), strict=True)
    ]
    second = [
        r.model_copy(update={"scores": {k: v - 5 for k, v in r.scores.items()}})
        if r.condition == "clarify@1"
        else r
        for r in first
    ]
    write_run(tmp_path / "a", first, [f"conditions={json.dumps(conditions)}"])
    write_run(
        tmp_path / "b",
        second,
        [f"conditions={json.dumps(conditions)}", "clarification.mode=all_at_once"],
    )
    runner = CliRunner()
    out = tmp_path / "report"
    done = runner.invoke(
        app, ["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]
    )
    assert done.exit_code == 0, done.output
    assert "paired on 3 instances" in done.output and "(n=3)" in done.output
    document = json.loads((out / "summary.json").read_text())
    row = next(r for r in document["comparisons"] if r["condition"] == "clarify@1")
    assert row["difference"] == 5.0 and row["n"] == 3
    text = (out / "report.md").read_text()
    assert "clarification `sequential`" in text and "clarification `all_at_once`" in text
    # (20 − 20) … gain recovered: (30 − 20) / (60 − 20) on the three instances.
    (a, _) = document["systems"].values()
    assert a["gains"]["clarify@1"]["gain_recovered"]["value"] == pytest.approx(0.25)
    for bad, message in (
        (["--failures", "drop"], "expected exclude or zero"),
        (["--min-gap", "0"], "must be a positive number"),
    ):
        refused = runner.invoke(app, ["report", str(tmp_path / "a"), *bad])
        assert refused.exit_code == 2 and message in refused.output
    missing = runner.invoke(app, ["report", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "not a run directory" in missing.output


def test_runs_written_before_multi_label_types_and_new_config_keys_still_report(tmp_path):
    """A record with one type per question and a config.yaml without judge/report/golden.seed
    (the previous version's files) are read, not refused."""
    old = Record.model_validate(
        {
            "instance_id": "a",
            "condition": "clarify@1",
            "seed": 0,
            "questions": ["Which year?"],
            "answers": ["2024"],
            "question_types": ["time"],
            "scores": {"restore_score_100": 50.0, "strict": 50.0, "unweighted": 50.0},
        }
    )
    assert old.question_types == [["time"]]
    write_run(tmp_path / "run", [old], ['conditions=["clarify@1"]'])
    config = tmp_path / "run" / "config.yaml"
    import yaml

    data = yaml.safe_load(config.read_text())
    for key in ("judge", "report"):
        del data["experiment"][key]
    del data["experiment"]["golden"]["seed"]
    config.write_text(yaml.safe_dump(data))
    paths = write_report([tmp_path / "run"], tmp_path / "run")
    (system,) = json.loads(paths.summary_json.read_text())["systems"].values()
    assert system["clarification"]["question_type_counts"]["time"] == 1


def test_records_of_different_dialogues_mixed_are_warned_about():
    records = [
        asked("a", "clarify@1", 10, ("Which year?", "unknown", ["time"])),
        asked(
            "a", "clarify@2", 10, ("Which city?", "x", ["region"]), ("Which year?", "y", ["time"])
        ),
    ]
    scored = score_records(records, ["clarify@1", "clarify@2"], [0], "exclude")
    summary = summarize(records, ["clarify@1", "clarify@2"], [0], ["a"], scored)
    assert summary["clarification"]["dialogue_mismatches"] == 1
    from cts.eval.report.warnings import warnings

    assert any("records of different dialogues are mixed" in w for w in warnings("s", summary))


def test_report_html_renders_the_markdown_it_writes_inline():
    """Lists and `code` spans as HTML, everything else escaped (a system name is text)."""
    from cts.eval.report.html import to_html

    page = to_html("- WARNING `x<y`: a\n- b & c\n\nplain `code` <b>\n| h |\n|---|\n| `v` |", [])
    assert "<ul><li>WARNING <code>x&lt;y</code>: a</li><li>b &amp; c</li></ul>" in page
    assert "<p>plain <code>code</code> &lt;b&gt;</p>" in page
    assert "<td><code>v</code></td>" in page


def test_a_multi_seed_report_shows_where_the_noise_comes_from_and_each_mde():
    """Two seeds: blurred scores a = (10, 14), b = (40, 40), c = (0, 4); clarify@1 = blurred +
    20, 8, 2 on its seed means, with seeds (30, 34), (46, 50), (2, 10). By hand: blurred's
    within (8 + 0 + 8)/3 = 16/3, its instance means 12, 40, 2 (variance 388) less the seeds'
    part 8/3: between 385.33. D = 20, 8, 4: variance 69.33, but on 3 instances the sign-flip
    p is never below 2/2³ = 0.25: no MDE."""
    scores = {"a": ((10, 14), (30, 34)), "b": ((40, 40), (46, 50)), "c": ((0, 4), (2, 10))}
    records = [
        rec(i, c, float(s), seed=seed)
        for i, by_condition in scores.items()
        for c, seeds in zip(("blurred", "clarify@1"), by_condition, strict=True)
        for seed, s in enumerate(seeds)
    ]
    conditions = ["blurred", "clarify@1"]
    scored = score_records(records, conditions, [0, 1], "exclude")
    summary = summarize(records, conditions, [0, 1], ["a", "b", "c"], scored)
    blurred = summary["variance"]["blurred"]
    assert blurred["within"] == pytest.approx(16 / 3) and blurred["seeds"] == 2
    assert blurred["between"] == pytest.approx(388 - 8 / 3)
    assert blurred["seed_share"] == pytest.approx((16 / 3) / (388 - 8 / 3 + 16 / 3))
    gain = summary["gains"]["clarify@1"]
    assert gain["noise"]["variance"] == pytest.approx(208 / 3)
    assert gain["mde"] is None
    text = markdown([("sys", summary)], [], 3, "exclude")
    assert "Where the noise comes from" in text
    # The bootstrap over the 3 instances (squares about their seed means 8, 0, 8): resampling b
    # thrice (1/27 of resamples) spreads nothing, so both intervals start at 0; b, b, c (3/27)
    # has the most between, means 40, 40, 2 (variance 481.33) less within (8/3) / 2: 480; no b
    # (8/27) the most within, 8.
    assert (blurred["between_low"], blurred["between_high"]) == pytest.approx((0, 480))
    assert (blurred["within_low"], blurred["within_high"]) == pytest.approx((0, 8))
    assert f"| blurred | {385.33**0.5:.1f} [0.0, {480**0.5:.1f}] | {(16 / 3) ** 0.5:.1f} " in text
    assert f"| {(16 / 3) ** 0.5:.1f} [0.0, {8**0.5:.1f}] | 1% [" in text
    assert "| – (n too small: p ≥ 2/2ⁿ) |" in text
    assert "includes seed noise" not in text  # two seeds: between is apart from them

    other = [
        rec(r.instance_id, r.condition, r.scores["restore_score_100"] - 5, seed=r.seed)
        for r in records
    ]
    rows = compare_systems(
        [("A", scored), ("B", score_records(other, conditions, [0, 1], "exclude"))], conditions
    )
    # Every difference is exactly 5: no variance to give an MDE by.
    assert [r["mde"] for r in rows] == [None, None]


def test_the_failure_warning_counts_the_instances_failures_excluded():
    """a's clarify@1 failed; b has no clarify@1 record; c is scored here but, as if another run
    of the report lacked it, not among the paired ids. Three instances are excluded, one of
    them for a failure."""
    from cts.eval.report.warnings import warnings

    conditions = ["blurred", "clarify@1"]
    records = [
        *(rec(i, "blurred", 10.0) for i in "abcde"),
        rec("a", "clarify@1", None, error=FAILED),
        *(rec(i, "clarify@1", 20.0) for i in "cde"),
    ]
    scored = score_records(records, conditions, [0], "exclude")
    summary = summarize(records, conditions, [0], ["d", "e"], scored)
    assert sorted(summary["excluded_instances"]) == ["a", "b", "c"]
    (line,) = [w for w in warnings("s", summary) if "records failed" in w]
    assert "1 of 9 records failed" in line
    assert "(1 instance excluded for a failed record; 3 excluded in all, the others' why" in line
    records.append(rec("b", "clarify@1", 20.0))  # now only the failure excludes an instance
    scored = score_records(records, conditions, [0], "exclude")
    only_failed = summarize(records, conditions, [0], ["b", "c", "d", "e"], scored)
    (line,) = [w for w in warnings("s", only_failed) if "records failed" in w]
    assert "(1 instance excluded for a failed record)" in line


def one_seed_run(n: int, base: float = 0.0) -> list[Record]:
    """n instances, one seed: blurred 10·j, each clarify@k 10·j + 5 + (j mod 3) + k, so the
    differences from blurred vary (5, 6, 7, … plus k)."""
    return [
        rec(f"i{j}", c, base + 10.0 * j + (5 + j % 3 + k if k else 0))
        for j in range(n)
        for k, c in enumerate(["blurred", "clarify@1", "clarify@2", "clarify@3"])
    ]


def test_an_mde_the_sign_flip_test_cannot_reach_is_undefined_and_says_why():
    """At α = 0.05 a sign-flip test on 5 instances cannot give p ≤ α (2/2⁵ = 0.0625), on 6 it
    can (0.03125): clarify@1 − blurred = 5, 6, 7, 5, 6, 7 has mean 6 and variance 4/5 = 0.8.
    With one seed the sd between instances carries the seeds' noise, and says so."""
    from cts.eval.score.power import mde

    conditions = ["blurred", "clarify@1"]
    for n, expected in ((5, None), (6, mde(0.8, 6))):
        records = [r for r in one_seed_run(n) if r.condition in conditions]
        scored = score_records(records, conditions, [0], "exclude")
        ids = paired_instances([(scored, conditions)])
        summary = summarize(records, conditions, [0], ids, scored)
        gain = summary["gains"]["clarify@1"]
        assert gain["n"] == n and gain["noise"]["variance"] == pytest.approx(0.8 if n == 6 else 0.7)
        text = markdown([("sys", summary)], [], n, "exclude")
        if expected is None:
            assert gain["mde"] is None and "| – (n too small: p ≥ 2/2ⁿ) |" in text
        else:
            assert gain["mde"] == pytest.approx(expected) and f"| {expected:.1f} |" in text
            assert "n too small" not in text
        assert "| blurred | " in text and "(includes seed noise: one seed) | – (one seed) |" in text


def test_a_holm_row_has_no_mde_where_alpha_over_m_is_out_of_reach():
    """Two systems on 6 instances, one seed: the blurred row is tested at α = 0.05 (2/2⁶ =
    0.03125 ≤ α: an MDE), the three clarify@k rows form a Holm family, each at α/3 = 0.0167 <
    2/2⁶: none."""
    conditions = ["blurred", "clarify@1", "clarify@2", "clarify@3"]
    first = one_seed_run(6)
    # The second system: every score less 3 + (j mod 2), so the differences vary.
    second = [
        rec(
            r.instance_id,
            r.condition,
            r.scores["restore_score_100"] - 3 - int(r.instance_id[1:]) % 2,
        )
        for r in first
    ]
    runs = [score_records(records, conditions, [0], "exclude") for records in (first, second)]
    rows = compare_systems([("A", runs[0]), ("B", runs[1])], conditions)
    mdes = {r["condition"]: r["mde"] for r in rows}
    # blurred: D = 3, 4, 3, 4, 3, 4, variance 0.3.
    from cts.eval.score.power import mde

    assert mdes["blurred"] == pytest.approx(mde(0.3, 6))
    assert [mdes[c] for c in conditions[1:]] == [None, None, None]
    summaries = [
        ("A", summarize(first, conditions, [0], [f"i{j}" for j in range(6)], runs[0])),
        ("B", summarize(second, conditions, [0], [f"i{j}" for j in range(6)], runs[1])),
    ]
    text = markdown(summaries, rows, 6, "exclude")
    table = [line for line in text.splitlines() if line.startswith("| A − B |")]
    assert len(table) == 4 and f"| {mdes['blurred']:.1f} | 6 |" in table[0]
    assert all("| – (n too small: p ≥ 2/2ⁿ) | 6 |" in line for line in table[1:])
