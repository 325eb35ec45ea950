"""`cts judge calibrate`: the judge against people's labels, on the shipped labelled set, with
scripted judges whose figures are worked out by hand."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Callable

import pytest
from typer.testing import CliRunner

import cts.eval.audit.calibration
from cts.cli import app
from cts.eval.audit.calibration import (
    Calibration,
    agreement,
    calibrate,
    flipped,
    judge_call,
    length_quartiles,
)
from cts.eval.audit.judge_labels import LABELS, SAMPLE_LABELS, LabelSet, read_labels
from cts.eval.run.config_sections import JudgeConfig
from cts.serving.errors import EngineError
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import ChatRequest, Sampling
from tests.builders import (
    assert_refuses_missing_and_empty,
    calibrate_cli,
    calibration_requests,
    labels_file_problems,
    sample_instances,
    scripted_role,
)

# -- agreement on tables small enough to check by hand ------------------------------------------


def test_agreement_on_a_small_table():
    # full/full, partial/full, none/none, none/partial: p_o = 2/4; people full 1, partial 1,
    # none 2; judge full 2, partial 1, none 1: p_e = (1·2 + 1·1 + 2·1) / 16 = 5/16;
    # κ = (8/16 − 5/16) / (11/16) = 3/11.
    # Strict: people full, rest, rest, rest; judge full, full, rest, rest: p_o = 3/4;
    # p_e = (1·2 + 3·2) / 16 = 1/2; κ = (3/4 − 1/2) / (1/2) = 1/2.
    found = agreement(["full", "partial", "none", "none"], ["full", "full", "none", "partial"])
    assert found.n == 4 and found.accuracy == pytest.approx(0.5)
    assert found.kappa == pytest.approx(3 / 11)
    assert found.strict_kappa == pytest.approx(1 / 2)
    assert found.confusion == [[1, 0, 0], [1, 0, 0], [0, 1, 1]]
    # Shift: (1−1) + (1−0.5) + (0−0) + (0.5−0) = 1 over 4 pairs: +25 points.
    assert found.shift == pytest.approx(25.0)
    # A judge that gives one label to every pair the people gave it too: κ is undefined.
    same = agreement(["none"] * 3, ["none"] * 3)
    assert same.kappa is None and same.accuracy == 1.0
    assert agreement([], []).kappa is None and agreement([], []).shift is None


# -- the shipped labelled set -----------------------------------------------------------------

# Counted once by hand from cts/eval/sample_data/judge_labels.jsonl; the κ below are worked out
# from them, so a changed file must change this line (and the arithmetic) first.
SHIPPED = {"full": 55, "partial": 26, "none": 37}


@pytest.fixture(scope="module")
def shipped() -> LabelSet:
    return read_labels("sample")


def test_the_shipped_set_has_both_languages_and_every_label(shipped):
    assert shipped.path == str(SAMPLE_LABELS)
    pairs = [(a.language, n.label) for a in shipped.answers for n in a.nuggets]
    assert len(pairs) == shipped.pairs == 118 >= 80
    assert Counter(label for _, label in pairs) == SHIPPED
    for language in ("en", "zh"):
        assert {label for lang, label in pairs if lang == language} == set(LABELS)
    # Every answer is one batch the judge can take whole, and has a query to show.
    assert all(1 < len(a.nuggets) <= 10 and a.query for a in shipped.answers)
    rows = [json.loads(line) for line in SAMPLE_LABELS.read_text().splitlines()]
    # Every answer is about an instance of the sample benchmark, its nuggets that instance's.
    instances = sample_instances(SAMPLE_LABELS)
    for row in rows:
        gold = {n["id"]: n["text"] for n in instances[row["instance_id"]]["golden"]["nuggets"]}
        assert gold[row["nugget_id"]] == row["nugget"], row["id"]
        assert row["query"] == instances[row["instance_id"]]["fused_query"]


# -- scripted judges ---------------------------------------------------------------------------


def _listing(request: ChatRequest) -> tuple[str, list[tuple[str, str]]]:
    """The answer and the (id, text) nuggets of a judge request, in the order shown."""
    user = request.messages[-1].content
    found = re.search(r"(?:Answer:|回答：)\n(.*)\n\n(?:Nuggets:|要点：)\n(.*)\Z", user, re.S)
    assert found, user
    ids = request.output.json_schema["required"]  # type: ignore[union-attr]
    lines = found.group(2).split("\n")
    assert [line.split(": ", 1)[0] for line in lines] == ids
    return found.group(1), [tuple(line.split(": ", 1)) for line in lines]  # type: ignore[misc]


def _reply(labels: dict[str, str]) -> str:
    return json.dumps({i: {"evidence": "e", "label": label} for i, label in labels.items()})


def people_judge(shipped: LabelSet, change: Callable[[str], str] = lambda x: x):
    """A scripted judge that gives the people's label, passed through `change`: it reads the
    answer and each nugget's text from the prompt, so it does not care about the order."""
    people = {(a.answer, n.text): n.label for a in shipped.answers for n in a.nuggets}

    def script(request: ChatRequest) -> str:
        answer, nuggets = _listing(request)
        return _reply({i: change(people[(answer, text)]) for i, text in nuggets})

    return script


def by_position(request: ChatRequest) -> str:
    """Labels by where a nugget stands in the batch: full, partial, none, full, …"""
    _, nuggets = _listing(request)
    return _reply({i: LABELS[k % 3] for k, (i, _) in enumerate(nuggets)})


def run(script, labels: LabelSet, options: JudgeConfig | None = None) -> Calibration:
    options = options or JudgeConfig()
    call = judge_call(ScriptedEngine(script, name="judge"), Sampling(), options)
    return asyncio.run(calibrate(call, labels, options.batch_size))


def test_a_judge_that_calls_every_partial_full(shipped):
    result = run(people_judge(shipped, lambda x: "full" if x == "partial" else x), shipped)
    a = result.agreement
    # People: full 55, partial 26, none 37 (n = 118). The judge: full 55 + 26 = 81, partial
    # 0, none 37; it agrees on 55 + 37 = 92 pairs.
    # κ: p_o = 92/118, p_e = (55·81 + 26·0 + 37·37)/118² = 5824/13924;
    #    κ = (92·118 − 5824) / (118² − 5824) = (10856 − 5824) / (13924 − 5824) = 5032/8100.
    # strict (full vs rest): people full 55, rest 63; judge full 81, rest 37; agreement still
    #    92; p_e = (55·81 + 63·37)/13924 = 6786/13924; κ = (10856 − 6786)/(13924 − 6786)
    #    = 4070/7138.
    assert a.n == 118 and a.accuracy == pytest.approx(92 / 118)
    assert a.kappa == pytest.approx(5032 / 8100)
    assert a.strict_kappa == pytest.approx(4070 / 7138)
    assert a.confusion == [[55, 0, 0], [26, 0, 0], [0, 0, 37]]
    # It reads content, not places: shuffling and re-asking change nothing.
    assert (result.order_flip.count, result.order_flip.n) == (0, 118)
    assert (result.rerun.count, result.rerun.n) == (0, 118)
    assert result.failed == {}
    # Per language: the same confusion, split (en: full 34, partial 15, none 30).
    assert result.by_language["en"].confusion == [[34, 0, 0], [15, 0, 0], [0, 0, 30]]
    assert result.by_language["zh"].confusion == [[21, 0, 0], [11, 0, 0], [0, 0, 7]]
    # The bias tables: at every position and length, the judge's full rate is the people's
    # full + partial rate, its partial rate 0, its none rate the people's.
    for table in (result.by_position, result.by_length):
        assert sum(row.n for row in table) == 118
        for row in table:
            assert row.judge["full"] == pytest.approx(row.people["full"] + row.people["partial"])
            assert row.judge["partial"] == 0
            assert row.judge["none"] == pytest.approx(row.people["none"])


def test_a_judge_that_labels_by_position_flips_when_the_order_changes(shipped):
    result = run(by_position, shipped)
    # Its label for a nugget is LABELS[place % 3], so a nugget's label changes exactly when
    # the shuffle moves it to a place of another residue mod 3.
    expected = 0
    for answer in shipped.answers:
        order = flipped(answer)
        assert order != list(answer.nuggets)  # every answer is shown in another order
        for k, nugget in enumerate(answer.nuggets):
            expected += order.index(nugget) % 3 != k % 3
    assert result.order_flip.n == 118
    assert result.order_flip.count == expected > 0
    assert result.rerun.count == 0  # the same request, the same labels
    # Position bias, measured: place 1 is always full, 2 partial, 3 none, 4 full …; 22
    # answers have places 1-5, the 8 six-nugget answers a 6th.
    table = {row.bucket: row for row in result.by_position}
    assert [(b, table[b].n) for b in table] == [
        ("1", 22),
        ("2", 22),
        ("3", 22),
        ("4", 22),
        ("5", 22),
        ("6", 8),
    ]
    for place, row in table.items():
        assert row.judge[LABELS[(int(place) - 1) % 3]] == 1.0
    # The people's rates at the same places are there to compare with, and are not uniform.
    assert table["1"].people != table["3"].people


def test_batches_follow_judge_batch_size(shipped):
    engine_requests: list[ChatRequest] = []

    def script(request: ChatRequest) -> str:
        engine_requests.append(request)
        return by_position(request)

    result = run(script, shipped, JudgeConfig(batch_size=2))
    assert max(len(r.output.json_schema["required"]) for r in engine_requests) == 2  # type: ignore[union-attr]
    # Places within a batch of 2: 1 or 2 only; the judge labels place 1 full, 2 partial.
    assert [row.bucket for row in result.by_position] == ["1", "2"]
    assert sum(row.n for row in result.by_position) == 118


def test_rerun_identity_counts_labels_that_change_on_the_same_request(shipped):
    seen: Counter[str] = Counter()
    people = people_judge(shipped)

    def moody(request: ChatRequest) -> str:
        """The people's labels the first time a request is seen; the second time the same
        request comes, its first nugget's label changes."""
        key = request.model_dump_json()
        seen[key] += 1
        labels = {i: v["label"] for i, v in json.loads(people(request)).items()}
        if seen[key] > 1:
            first = next(iter(labels))
            labels[first] = "none" if labels[first] == "full" else "full"
        return _reply(labels)

    result = run(moody, shipped)
    # One label changes per answer on the rerun: 22 of 118. The shuffled pass sends other
    # requests (another order), so nothing changes there; the listed pass is the people's.
    assert (result.rerun.count, result.rerun.n) == (22, 118)
    assert result.order_flip.count == 0
    assert result.agreement.kappa == pytest.approx(1.0)


def test_a_failed_judge_call_is_left_out_and_listed(shipped):
    broken = shipped.answers[0]
    people = people_judge(shipped)

    def script(request: ChatRequest) -> str | Exception:
        if broken.answer in request.messages[-1].content:
            return EngineError("invalid JSON")
        return people(request)

    options = JudgeConfig()
    call = judge_call(ScriptedEngine(script, name="judge"), Sampling(), options)
    finished: list[bool] = []
    result = asyncio.run(calibrate(call, shipped, options.batch_size, done=finished.append))
    # Every answer of the three passes reported done, the broken one failed in each pass.
    assert (len(finished), sum(finished)) == (cts.eval.audit.calibration.judged_batches(shipped), 3)
    lost = len(broken.nuggets)
    assert result.agreement.n == result.rerun.n == result.order_flip.n == 118 - lost
    assert set(result.failed) == {"listed", "shuffled", "rerun"}
    assert "invalid JSON" in result.failed["listed"][broken.group]
    text = cts.eval.audit.calibration.render(result)
    assert f"- {broken.group}: " in text


def test_an_unexpected_error_on_one_answer_is_listed_against_its_rows_not_fatal(tmp_path):
    path = tmp_path / "labels.jsonl"
    rows = [
        {"group": "bad", "answer": "Firmware 3.2.1.", "nugget": "Version 3.", "label": "partial"},
        {"group": "bad", "answer": "Firmware 3.2.1.", "nugget": "Firmware.", "label": "full"},
        {"group": "ok", "answer": "It costs 5 euros.", "nugget": "5 euros.", "label": "full"},
        {"group": "ok", "answer": "It costs 5 euros.", "nugget": "Red.", "label": "none"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    labels = read_labels(path)

    async def call(answer, nuggets):
        if answer.group == "bad":  # a judge that cannot read this answer (not an engine error)
            raise ValueError("could not convert string to float: '3.2.1'")
        return {n.id: n.label for n in nuggets}

    finished: list[bool] = []
    result = asyncio.run(calibrate(call, labels, done=finished.append))
    # 2 answers over 3 passes (both have 2 nuggets, so both are shuffled): 6 calls, the bad
    # answer failing in each; the other answer's 2 labels are the people's.
    assert (len(finished), sum(finished)) == (6, 3)
    assert (result.agreement.n, result.agreement.accuracy) == (2, 1.0)
    assert set(result.failed) == {"listed", "shuffled", "rerun"}
    why = result.failed["listed"]["bad"]
    assert why.startswith("lines 1, 2: unexpected error (a bug in the judge?) ValueError: ")
    text = cts.eval.audit.calibration.render(result)
    assert "1 answer(s) failed in the listed pass" in text and "- bad: lines 1, 2:" in text


def test_length_buckets_cut_the_answers_into_quarters(shipped):
    buckets = length_quartiles(shipped.answers)
    assert set(buckets) == {a.group for a in shipped.answers}
    sizes = Counter(buckets.values())
    assert len(sizes) == 4 and max(sizes.values()) - min(sizes.values()) <= 1
    lows = sorted(int(b.split("-")[0]) for b in sizes)
    highs = sorted(int(b.split("-")[1]) for b in sizes)
    assert all(h < lo for h, lo in zip(highs, lows[1:], strict=False))  # disjoint, in order


# -- bad labels files --------------------------------------------------------------------------


def test_every_bad_row_is_named_with_file_line_and_field(tmp_path):
    good = {"group": "g", "answer": "A.", "nugget": "N.", "label": "full"}
    path = tmp_path / "labels.jsonl"
    found = labels_file_problems(
        read_labels,
        path,
        good,
        # From line 3 on.
        {**good, "label": "Full"},
        {"group": "g", "answer": "A.", "label": "none"},
        {**good, "lable": "none"},
        {**good, "answer": "Another answer."},
        {**good, "id": "x", "nugget_id": "n1"},
        {**good, "id": "x"},
        {**good, "nugget": ""},
        {**good, "nugget_id": "n1"},
        {**good, "group": "h", "language": "chinese"},  # as the answerer labels refuse it
        {**good, "group": "z", "language": "zh"},
        {**good, "group": "i", "language": "en-GB"},
    )
    assert f"{path}:3: label: must be one of full, partial, none, got 'Full'" in found
    assert f"{path}:4: nugget: missing" in found
    assert any(p.startswith(f"{path}:5: lable: unknown field") for p in found)
    assert any(p.startswith(f"{path}:6: answer: differs from line 1") for p in found)
    assert f"{path}:8: id: duplicate: 'x' is also on line 7" in found
    assert f"{path}:10: nugget_id: duplicate in this answer: 'n1' is also on line 7" in found
    assert f"{path}:9: nugget: empty" in found
    assert f"{path}:11: language: unknown language 'chinese' (an ISO 639-1 code)" in found
    assert not any(p.startswith((f"{path}:12:", f"{path}:13:")) for p in found)
    assert_refuses_missing_and_empty(read_labels, tmp_path)


# -- the command line --------------------------------------------------------------------------


def _scripted_judge(monkeypatch, script) -> dict[str, object]:
    """`cts judge calibrate`'s engines replaced by a scripted judge; what it was opened with."""
    return scripted_role(monkeypatch, cts.eval.audit.calibration, "judge", script)


def test_cts_judge_calibrate_end_to_end(tmp_path, monkeypatch, shipped):
    monkeypatch.setenv("COLUMNS", "200")
    opened = _scripted_judge(
        monkeypatch, people_judge(shipped, lambda x: "full" if x == "partial" else x)
    )
    out = tmp_path / "figures" / "calibration.json"
    done = calibrate_cli(
        "judge",
        SAMPLE_LABELS,
        out,
        tmp_path / "responses.sqlite",
        "--set",
        "roles.judge.model=smollm2-135m-instruct",  # a model judge (scripted here)
    )
    assert done.exit_code == 0, done.output
    # The judge role alone, and never through the response cache (a rerun must reach it), at
    # the judge's own sampling.
    requests = calibration_requests(opened, "judge")
    # 22 answers listed + 22 shuffled + 22 again, shown as they go (not a terminal: lines).
    assert len(requests) == 66
    assert "judge calibration (3 passes): 0/66 done (0 already), 0 failed" in done.output
    assert "judge calibration (3 passes): 66/66 done (0 already), 0 failed" in done.output
    assert "| Cohen's κ, full / partial / none | 0.621 (95% CI " in done.output
    assert "| Cohen's κ, strict (full vs rest) | 0.570 | 118 |" in done.output
    assert (
        "| order flip (labels changed when the nuggets are shuffled) | 0.0% (0) | 118 |"
        in done.output
    )
    assert "(smollm2-135m-instruct)" in done.output
    document = json.loads(out.read_text())
    assert document["judge"] == "smollm2-135m-instruct"
    assert document["agreement"]["kappa"] == pytest.approx(5032 / 8100)
    low, high = document["kappa_ci"]
    assert low < 5032 / 8100 < high
    assert document["agreement"]["confusion"] == [[55, 0, 0], [26, 0, 0], [0, 0, 37]]
    assert document["rerun"] == {"n": 118, "changed": 0, "share": 0.0}
    assert sum(row["n"] for row in document["by_length"]) == 118


def test_cts_judge_calibrate_names_a_bad_labels_file_before_loading_a_model(tmp_path, monkeypatch):
    opened = _scripted_judge(monkeypatch, by_position)
    bad = tmp_path / "labels.jsonl"
    bad.write_text(
        json.dumps({"answer": "A.", "nugget": "N.", "label": "full"})
        + "\n"
        + json.dumps({"answer": "A.", "nugget": "M.", "label": "yes"})
        + "\n"
    )
    done = CliRunner().invoke(app, ["judge", "calibrate", "--labels", str(bad)])
    assert done.exit_code == 2
    assert "dataset error" in done.output
    assert f"{bad}:2: label: must be one of full, partial, none, got 'yes'" in done.output
    assert opened == {}  # no engine was opened


def test_cts_judge_calibrate_passes_agreement_judges_each_answer_once(
    tmp_path, monkeypatch, shipped
):
    monkeypatch.setenv("COLUMNS", "200")
    opened = _scripted_judge(monkeypatch, people_judge(shipped, lambda x: x))
    out = tmp_path / "calibration.json"
    args = ["judge", "calibrate", "--labels", str(SAMPLE_LABELS), "--out", str(out)]
    done = CliRunner().invoke(
        app, [*args, "--passes", "agreement", "--set", f"cache.path={tmp_path / 'r.sqlite'}"]
    )
    assert done.exit_code == 0, done.output
    assert len(opened["engine"].requests) == 22  # type: ignore[attr-defined]
    assert "| Cohen's κ, full / partial / none | 1.000" in done.output
    assert "not measured (--passes agreement)" in done.output
    document = json.loads(out.read_text())
    assert document["order_flip"] is None and document["rerun"] is None
    bad = CliRunner().invoke(app, [*args, "--passes", "some"])
    assert bad.exit_code == 2 and "--passes must be one of all, agreement" in bad.output
