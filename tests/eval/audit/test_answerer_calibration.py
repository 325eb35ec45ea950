"""`cts answerer calibrate`: the User Answerer against a careful person's answers, on tables
small enough to check by hand and on the shipped labelled set, with scripted answerers."""

from __future__ import annotations

import asyncio
import fnmatch
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import cts.eval.audit.answerer_calibration
from cts.agents.user_answerer import is_span
from cts.cli import app
from cts.eval.audit.answer_match import LabelledQuestion, contains, disclosure_values, normalise
from cts.eval.audit.answerer_calibration import (
    SAMPLE_ANSWERER_LABELS,
    AnswerCall,
    AnswererCalibration,
    AnswerLabelSet,
    answerer_call,
    calibrate,
    figures,
    read_answer_labels,
    score,
)
from cts.eval.data.schema import CONSTRAINT_TYPES, Instance
from cts.eval.run.config_sections import AnswerSpan, ClarificationConfig
from cts.eval.run.dialogue import Clarification
from cts.eval.score.kappa import Rate
from cts.serving.errors import EngineError
from cts.serving.scripted import ScriptedEngine, fused_query
from cts.serving.types import ChatRequest, Sampling
from tests.builders import (
    assert_refuses_missing_and_empty,
    calibrate_cli,
    calibration_requests,
    dataset_problems,
    labels_file_problems,
    sample_instances,
    scripted_role,
)

TAX = "How much is the overnight tourist tax for hotel stays in Calvanne in 2025?"
TV = "What does the Ferrow Lumen 65-inch OLED TV cost, and what refresh rate does it support?"
TV_BLURRED = "What does the Ferrow Lumen OLED TV cost, and what refresh rate does it support?"
RENT = "溪川市2025年公租房申请的收入标准是多少？"

# -- normalising and matching -----------------------------------------------------------------


def test_normalising_folds_case_space_punctuation_and_width():
    assert normalise("  Spring,   2024! ") == normalise("spring 2024") == "spring 2024"
    assert normalise("２０２５年") == normalise("2025 年") == "2025 年"  # full-width digits
    assert normalise("“暖巢计划”，") == "暖 巢 计 划"
    # Containment is by whole tokens: `men` is not in `women's`, `Pro` is in the full name.
    assert not contains("women's", "men's") and contains("the men's race", "men's")
    assert contains("Korvex Aura Pro earbuds", "Pro") and not contains("Propane", "Pro")
    assert contains("溪川市2025年", "2025年") and not contains("2025年", "溪川市")
    assert not contains("anything", "")


def test_disclosure_values_are_numbers_names_quotes_and_chinese_names():
    # `How` opens the sentence; `Calvanne` and `2025` are values; the rest lower-case.
    assert disclosure_values(TAX) == ["Calvanne", "2025"]
    assert disclosure_values(TV) == ["Ferrow", "Lumen", "65-inch", "OLED", "TV"]
    # A possessive names its owner; the quoted span is a value of its own.
    assert disclosure_values(
        "In radio astronomy, what does Ostreby Council's term 'Tallis gap' mean?"
    ) == ["Ostreby", "Council", "Tallis", "Tallis gap"]
    assert disclosure_values(RENT) == ["2025", "溪川市"]
    assert disclosure_values("枫渚市“暖巢计划”的补贴") == ["暖巢计划", "枫渚市"]
    # 市场 is a market, not a city.
    assert disclosure_values("国内市场份额") == []


# -- the figures on a table small enough to check by hand --------------------------------------


def _q(
    id: str,
    fused: str,
    question: str,
    expected: str,
    kind: str,
    language: str = "en",
    blurred: str | None = None,
) -> LabelledQuestion:
    return LabelledQuestion(id, 0, fused, question, expected, language, kind, blurred)


HAND = AnswerLabelSet(
    "hand",
    (
        _q("r1", TAX, "Which city?", "Calvanne", "region"),
        _q("r2", TAX, "Which year?", "2025", "time"),
        _q("r3", TAX, "How many nights?", "unknown", "numeric"),
        _q("r4", TV, "Which screen size?", "65-inch", "numeric", blurred=TV_BLURRED),
        _q("r5", TV, "Which country?", "unknown", "region", blurred=TV_BLURRED),
        _q("r6", TV, "Which size?", "65-inch", "numeric", blurred=TV_BLURRED),
        _q("r7", RENT, "是哪一年的标准？", "2025年", "time", "zh"),
        _q("r8", RENT, "您说的是哪个城市？", "溪川市", "region", "zh"),
    ),
)
HAND_ANSWERS = {
    "r1": "Calvanne",  # exact
    "r2": "Calvanne in 2025",  # contains 2025, and discloses Calvanne (not asked)
    "r3": "2025",  # a value where the fused query says nothing: false answer
    "r4": "unknown",  # false unknown
    "r5": "unknown",  # exact
    "r6": "65-inch OLED TV",  # contains; OLED and TV are in the blurred query: nothing new
    "r7": "２０２５年",  # exact once full-width digits are folded
    "r8": "溪川市2025年",  # contains, and discloses 2025年 (r7's value, holding the number)
}


def test_the_figures_on_a_small_table():
    verdicts = [score(q, HAND_ANSWERS[q.id], HAND.siblings(q)) for q in HAND.items]
    assert [v.outcome for v in verdicts] == [
        "exact",
        "contained",
        "false answer",
        "false unknown",
        "exact",
        "contained",
        "exact",
        "contained",
    ]
    assert [v.disclosed for v in verdicts] == [(), ("Calvanne",), (), (), (), (), (), ("2025年",)]
    found = figures(verdicts)
    # exact: r1 r5 r7 = 3 of 8; containment adds r2 r6 r8 = 6 of 8.
    assert (found.exact, found.containment) == (Rate(8, 3), Rate(8, 6))
    # Rows with a value: r1 r2 r4 r6 r7 r8 = 6, one (r4) answered unknown.
    assert found.false_unknown == Rate(6, 1)
    # `unknown` rows: r3 r5 = 2, r3 answered with a value.
    assert found.false_answer == Rate(2, 1)
    # Value rows answered with a value: r1 r2 r6 r7 r8 = 5; r2 and r8 disclose more.
    assert found.over_disclosure == Rate(5, 2) and found.over_disclosure.share == 0.4


def test_the_figures_per_language_and_constraint_type():
    result = asyncio.run(calibrate(_lookup(HAND_ANSWERS), HAND))
    en, zh = result.by_language["en"], result.by_language["zh"]
    # en: r1-r6. exact r1 r5; contained + r2 r6; values r1 r2 r4 r6 (r4 unknown); unknown
    # rows r3 r5 (r3 answered); answered values r1 r2 r6 (r2 discloses).
    assert (en.n, en.exact, en.containment) == (6, Rate(6, 2), Rate(6, 4))
    assert (en.false_unknown, en.false_answer, en.over_disclosure) == (
        Rate(4, 1),
        Rate(2, 1),
        Rate(3, 1),
    )
    # zh: r7 exact, r8 contained and disclosing; no unknown rows, so no false-answer share.
    assert (zh.exact, zh.containment, zh.over_disclosure) == (Rate(2, 1), Rate(2, 2), Rate(2, 1))
    assert zh.false_answer == Rate(0, 0) and zh.false_answer.share is None
    kinds = result.by_constraint_type
    assert list(kinds) == ["numeric", "region", "time"]
    # numeric r3 r4 r6: only r6 contains; values r4 r6, r4 unknown; r3 a false answer.
    assert (kinds["numeric"].containment, kinds["numeric"].false_unknown) == (
        Rate(3, 1),
        Rate(2, 1),
    )
    assert kinds["numeric"].false_answer == Rate(1, 1)
    # region r1 r5 r8: exact r1 r5; answered values r1 r8, r8 discloses.
    assert (kinds["region"].exact, kinds["region"].over_disclosure) == (Rate(3, 2), Rate(2, 1))
    # time r2 r7: exact r7; both contain; r2 discloses.
    assert (kinds["time"].exact, kinds["time"].over_disclosure) == (Rate(2, 1), Rate(2, 1))
    # The cases: every answer not exact, or disclosing (r2 r3 r4 r6 r8).
    assert [v.id for v in result.cases] == ["r2", "r3", "r4", "r6", "r8"]
    text = cts.eval.audit.answerer_calibration.render(result)
    assert "| over-disclosure (a value answer giving a value not asked for) | 40.0% (2) | 5 |" in (
        text
    )
    assert "- r2 [en, time] contained: `Which year?` expected `2025`, answered `Calvanne in " in (
        text
    )
    assert "| zh | 2 | 50% (1/2) | 100% (2/2) | 0% (0/2) | – | 50% (1/2) |" in text


# -- removed spans: an answer that reveals a removed constraint not asked about ---------------

# Blurring removed two lower-case qualifiers, neither a number, a name nor a quote: the
# disclosure values cannot see them, the spans can.
TAX_BLURRED = "How much is the tourist tax in Calvanne in 2025?"
TAX_REMOVED = [{"type": "time", "span": "overnight"}, {"type": "scope", "span": "for hotel stays"}]
STAY = {
    "fused_query": TAX,
    "blurred_query": TAX_BLURRED,
    "question": "Which kind of stay is it?",
    "expected": "hotel stays",
    "constraint_type": "scope",
}


def _spanned(tmp_path: Path, rows: list[dict[str, Any]]) -> AnswerLabelSet:
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return read_answer_labels(path)


def test_an_answer_revealing_another_removed_span_over_discloses(tmp_path):
    labels = _spanned(
        tmp_path,
        [
            {**STAY, "id": "s1", "removed_constraints": TAX_REMOVED},
            {**STAY, "id": "s2", "removed_constraints": ["time", "scope"]},  # types only
            {**STAY, "id": "s3"},  # nothing recorded
        ],
    )
    assert labels.items[0].removed == (("time", "overnight"), ("scope", "for hotel stays"))
    assert labels.items[1].removed == (("time", ""), ("scope", ""))
    with_span, types_only, bare = labels.items
    # The whole sentence around the asked span: `overnight` is the other removed span.
    answer = "overnight tourist tax for hotel stays"
    verdict = score(with_span, answer)
    assert (verdict.disclosed, verdict.revealed, verdict.over_discloses) == (
        (),
        ("overnight",),
        True,
    )
    # Without spans the rule is not applied: the disclosure values alone, which see nothing.
    for item in (types_only, bare):
        assert (score(item, answer).revealed, score(item, answer).over_discloses) == ((), False)
    # The asked span whole, its function word included, reveals nothing; nor does a reply in
    # other words that holds no unit of the other span.
    for answer in ("for hotel stays", "hotel stays", "stays"):
        assert score(with_span, answer).over_discloses is False, answer
    # An abstractive answer (not a substring of the fused query) is matched by value.
    assert score(with_span, "hotel stays, overnight").revealed == ("overnight",)
    # Asked about the time, the scope span is the one not asked for.
    time_row = LabelledQuestion(
        "t", 0, TAX, "Day trip or overnight?", "overnight", "en", "time", TAX_BLURRED,
        removed=with_span.removed,
    )  # fmt: skip
    assert score(time_row, "overnight").revealed == ()
    assert score(time_row, "overnight tourist tax for hotel stays").revealed == ("for hotel stays",)


def test_spans_in_chinese_and_units_the_clarifier_already_has():
    blurred = "公租房申请的收入标准是多少？"
    removed = (("region", "溪川市"), ("time", "2025年"))
    year = LabelledQuestion(
        "z", 0, RENT, "是哪一年的标准？", "2025年", "zh", "time", blurred, None, removed
    )
    # One CJK character of the other span is enough; the asked span alone is not.
    assert score(year, "川市2025年").revealed == ("溪川市",)
    assert score(year, "２０２５年").revealed == ()  # full width folded: the asked span
    # A unit the question already says is not revealed by the answer repeating it.
    told = LabelledQuestion(
        "z", 0, RENT, "是溪川市哪一年的标准？", "2025年", "zh", "time", blurred, None, removed
    )
    assert score(told, "溪川市2025年").revealed == ()
    # An untyped row asks about no removed constraint: any span beyond the expected answer.
    untyped = LabelledQuestion(
        "u", 0, RENT, "是哪一年？", "2025年", "zh", "untyped", blurred, None, removed
    )
    assert score(untyped, "2025年").revealed == ()
    assert score(untyped, "溪川市2025年").revealed == ("溪川市",)


def test_spans_change_the_figures_only_where_recorded(tmp_path):
    rows = [
        {**STAY, "id": "s1", "removed_constraints": TAX_REMOVED},
        {**STAY, "id": "s2", "removed_constraints": TAX_REMOVED},
        {**STAY, "id": "s3"},
    ]
    answers = {"s1": "overnight tourist tax for hotel stays", "s2": "hotel stays"}
    answers["s3"] = answers["s1"]
    result = asyncio.run(calibrate(_lookup(answers), _spanned(tmp_path, rows)))
    # s1 reveals `overnight`; s2 gives the asked value only; s3 records no span: as before.
    assert result.figures.over_disclosure == Rate(3, 1)
    assert [v.id for v in result.cases] == ["s1", "s3"]  # s2 is exact and tells nothing more
    document = json.loads(json.dumps(result.as_dict()))
    assert document["verdicts"][0]["revealed"] == ["overnight"]
    text = cts.eval.audit.answerer_calibration.render(result)
    assert "answered `overnight tourist tax for hotel stays`; reveals removed `overnight`" in text
    # The hand table again, every row recording its instance's types only: the same figures.
    typed = AnswerLabelSet(
        "typed", tuple(replace(q, removed=((q.constraint_type, ""),)) for q in HAND.items)
    )
    before = asyncio.run(calibrate(_lookup(HAND_ANSWERS), HAND))
    after = asyncio.run(calibrate(_lookup(HAND_ANSWERS), typed))
    assert after.figures == before.figures and after.verdicts == before.verdicts


def test_a_bad_removed_constraint_is_named_with_its_field(tmp_path):
    rows = [
        json.dumps({**STAY, "removed_constraints": TAX_REMOVED}),
        json.dumps({**STAY, "removed_constraints": "scope"}),
        json.dumps({**STAY, "removed_constraints": [{"type": "place", "span": "overnight"}]}),
        json.dumps({**STAY, "removed_constraints": [{"type": "time", "span": "weekly"}]}),
        json.dumps({**STAY, "removed_constraints": [{"type": "time", "span": "tourist tax"}]}),
        json.dumps({**STAY, "removed_constraints": [{"type": "time"}, 3]}),
    ]
    path = tmp_path / "labels.jsonl"
    found = dataset_problems(read_answer_labels, path, rows)
    assert found == {
        f"{path}:2: removed_constraints: must be a list, got str",
        f"{path}:3: removed_constraints[0]: must be one of {', '.join(CONSTRAINT_TYPES)}, "
        "got 'place'",
        f"{path}:4: removed_constraints[0].span: 'weekly' is not in fused_query",
        f"{path}:5: removed_constraints[0].span: 'tourist tax' is still in blurred_query",
        f"{path}:6: removed_constraints[0]: must be a type or a {{type, span}} object "
        "(span a string)",
        f"{path}:6: removed_constraints[1]: must be a type or a {{type, span}} object "
        "(span a string)",
    }


def _lookup(answers: dict[str, str]) -> AnswerCall:
    async def call(item: LabelledQuestion) -> str:
        return answers[item.id]

    return call


# -- scripted answerers, through the real User Answerer call -------------------------------------

SMALL = [
    {"id": "a", "fused_query": TAX, "question": "Which city is the hotel in?"},
    {"id": "b", "fused_query": TAX, "question": "For which year?"},
    {"id": "c", "fused_query": TAX, "question": "How many nights will you stay?"},
    {"id": "d", "fused_query": RENT, "question": "您说的是哪个城市？", "language": "zh"},
    {"id": "e", "fused_query": RENT, "question": "是哪一年的标准？", "language": "zh"},
    {"id": "f", "fused_query": RENT, "question": "您家有几口人？", "language": "zh"},
]
SMALL_EXPECTED = {"a": "Calvanne", "b": "2025", "c": "unknown"}
SMALL_EXPECTED |= {"d": "溪川市", "e": "2025年", "f": "unknown"}


@pytest.fixture
def small(tmp_path) -> Path:
    path = tmp_path / "small.jsonl"
    rows = [{**row, "expected": SMALL_EXPECTED[row["id"]]} for row in SMALL]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def over_sharer(request: ChatRequest) -> str:
    """Whatever is asked, the place and the year together (a real span of each query)."""
    return "Calvanne in 2025" if fused_query(request) == TAX else "溪川市2025年"


def shy(request: ChatRequest) -> str:
    """`unknown` unless asked for a city, then the city alone."""
    question, fused = request.messages[-1].content, fused_query(request)
    if "city" in question or "城市" in question:
        return "Calvanne" if fused == TAX else "溪川市"
    return "unknown"


def run(
    script: Callable[[ChatRequest], str | Exception],
    labels: AnswerLabelSet,
    options: ClarificationConfig | None = None,
) -> AnswererCalibration:
    call = answerer_call(ScriptedEngine(script, name="user"), Sampling(), options or _OPTIONS)
    return asyncio.run(calibrate(call, labels))


_OPTIONS = ClarificationConfig()


def _rates(
    script: Callable[[ChatRequest], str], small: Path
) -> tuple[AnswererCalibration, tuple[Rate, ...]]:
    """The calibration of `script` on the small table, and its figures in the table's order:
    exact, containment, false unknown, false answer, over-disclosure."""
    result = run(script, read_answer_labels(small))
    f = result.figures
    return result, (f.exact, f.containment, f.false_unknown, f.false_answer, f.over_disclosure)


def test_an_answerer_that_over_discloses(small):
    result, rates = _rates(over_sharer, small)
    # a: contains Calvanne, discloses 2025; b: contains 2025, discloses Calvanne; c: a value
    # for an unknown row; d, e, f the same in Chinese. No answer is the exact value.
    assert rates == (Rate(6, 0), Rate(6, 4), Rate(4, 0), Rate(2, 2), Rate(4, 4))
    assert [v.disclosed for v in result.verdicts] == [
        ("2025",),
        ("Calvanne",),
        (),
        ("2025年",),
        ("溪川市",),
        (),
    ]


def test_an_answerer_that_says_unknown_too_often(small):
    result, rates = _rates(shy, small)
    # a, d: the city, exact; b, e: unknown for a year that is there; c, f: rightly unknown.
    assert rates == (Rate(6, 4), Rate(6, 4), Rate(4, 2), Rate(2, 0), Rate(2, 0))
    assert [v.outcome for v in result.verdicts] == [
        "exact",
        "false unknown",
        "exact",
        "exact",
        "false unknown",
        "exact",
    ]


def test_a_failed_call_is_left_out_and_listed(small):
    def script(request: ChatRequest) -> str | Exception:
        if "nights" in request.messages[-1].content:
            return EngineError("boom")
        return shy(request)

    result = run(script, read_answer_labels(small))
    assert result.figures.n == 5 and result.figures.false_answer == Rate(1, 0)
    assert "boom" in result.failed["c"]
    assert "- c: EngineError: boom" in cts.eval.audit.answerer_calibration.render(result)
    # An answer outside the fused query (the span re-check) is a failure, not a figure.
    result = run(lambda request: "Paris", read_answer_labels(small))
    assert result.figures.n == 0 and len(result.failed) == 6
    assert "ConstrainedOutputError" in result.failed["a"]


@pytest.mark.parametrize(
    "options",
    [
        ClarificationConfig(),
        ClarificationConfig(answerer="abstractive"),
        ClarificationConfig(answer_span=AnswerSpan(max_words=2, max_cjk_chars=3)),
    ],
)
def test_the_answerer_is_asked_exactly_as_a_run_asks_it(options):
    """The same request as a run's dialogue sends for the same question and seed."""

    def reply(request: ChatRequest) -> str:
        return json.dumps({"answer": "x"}) if request.output.kind == "json" else "unknown"  # type: ignore[union-attr]

    sampling = Sampling(temperature=0.7, seed=1)
    for fused, language in ((TAX, "en"), (RENT, "zh")):
        ran, calibrated = ScriptedEngine(reply), ScriptedEngine(reply)
        dialogue = Clarification({"user_answerer": ran}, {"user_answerer": sampling}, options)
        instance = Instance(id="i", blurred_query="q", fused_query=fused, language=language)
        asyncio.run(dialogue._answer(instance, "Which year?", 5))
        item = _q("x", fused, "Which year?", "unknown", "time", language)
        call = answerer_call(calibrated, sampling.with_seed(5), options)

        async def ask(call: AnswerCall = call, item: LabelledQuestion = item) -> str:
            return await call(item)

        asyncio.run(ask())
        assert ran.requests == calibrated.requests and len(ran.requests) == 1
        assert ran.requests[0].sampling.seed == 5


# -- the shipped set ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shipped() -> AnswerLabelSet:
    return read_answer_labels("sample")


def _instances() -> dict[str, dict[str, Any]]:
    return sample_instances(SAMPLE_ANSWERER_LABELS)


# Counted once from cts/eval/sample_data/answerer_labels.jsonl (the README and answerer_labels.md
# quote them): a changed file must change this line first.
SHIPPED = {("en", "value"): 87, ("en", "unknown"): 50, ("zh", "value"): 19, ("zh", "unknown"): 14}


def test_the_shipped_set_covers_both_languages_every_type_and_absent_attributes(shipped):
    assert shipped.path == str(SAMPLE_ANSWERER_LABELS)
    items = shipped.items
    assert len(items) == 170 >= 80
    counts = Counter((q.language, "value" if q.expects_value else "unknown") for q in items)
    assert counts == SHIPPED
    assert sum(not q.expects_value for q in items) >= 40
    instances = _instances()
    data_types = {t for i in instances.values() for t in i["removed_constraints"]}
    assert data_types == set(CONSTRAINT_TYPES)  # the data has all seven
    for language in ("en", "zh"):
        mine = [q for q in items if q.language == language]
        # Every constraint type the data has in this language, asked with a value to copy.
        in_data = {
            t
            for i in instances.values()
            if i["language"] == language
            for t in i["removed_constraints"]
        }
        assert in_data <= {q.constraint_type for q in mine if q.expects_value}
        # Questions about what the fused query does not say, of several types.
        assert len({q.constraint_type for q in mine if not q.expects_value}) >= 5
    assert {q.constraint_type for q in items} == set(CONSTRAINT_TYPES)
    rows = [json.loads(line) for line in SAMPLE_ANSWERER_LABELS.read_text().splitlines()]
    for row in rows:
        instance = instances[row["instance_id"]]
        # Real queries of the sample benchmark, never retyped.
        assert row["fused_query"] == instance["fused_query"], row["id"]
        assert row["blurred_query"] == instance["blurred_query"], row["id"]
        assert row["language"] == instance["language"], row["id"]
        assert row["id"].startswith(row["instance_id"] + "/")
        # Every expected value is one the extractive answerer is able to give.
        if row["expected"] != "unknown":
            assert is_span(row["expected"], row["fused_query"]), row["id"]
    # Every instance of the sample benchmark is asked about, its removed constraint first.
    assert {row["instance_id"] for row in rows} == set(instances)
    for instance_id, instance in instances.items():
        first = next(row for row in rows if row["instance_id"] == instance_id)
        assert first["expected"] != "unknown", instance_id
        assert first["constraint_type"] in instance["removed_constraints"], instance_id


def test_the_shipped_set_and_its_rules_are_installed_with_the_package():
    # The `"cts.eval" = [...]` line of [tool.setuptools.package-data] (no tomllib on 3.10).
    pyproject = (Path(__file__).resolve().parents[3] / "pyproject.toml").read_text()
    data = pyproject.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    globs = json.loads(re.search(r"^\"cts.eval\" = (\[.*\])$", data, re.M).group(1))  # type: ignore[union-attr]
    for name in ("answerer_labels.jsonl", "answerer_labels.md"):
        assert (SAMPLE_ANSWERER_LABELS.parent / name).is_file()
        assert any(fnmatch.fnmatch(f"sample_data/{name}", glob) for glob in globs), name


def test_an_answerer_that_copies_the_labels_scores_full_marks(shipped):
    expected = {(q.fused_query, q.question): q.expected for q in shipped.items}

    def parrot(request: ChatRequest) -> str:
        return expected[(fused_query(request), request.messages[-1].content)]

    result = run(parrot, shipped)
    f = result.figures
    assert result.failed == {}  # every label passes the answerer's span re-check
    assert (f.exact, f.containment) == (Rate(170, 170), Rate(170, 170))
    assert (f.false_unknown, f.false_answer, f.over_disclosure) == (
        Rate(106, 0),
        Rate(64, 0),
        Rate(106, 0),
    )
    # The shipped rows record no removed spans: their figures are the disclosure values'.
    assert not any(q.removed for q in shipped.items)
    assert not any(v.revealed for v in result.verdicts)


# -- bad labels files --------------------------------------------------------------------------


def test_every_bad_row_is_named_with_file_line_and_field(tmp_path):
    good = {"fused_query": TAX, "question": "Which city?", "expected": "Calvanne"}
    path = tmp_path / "labels.jsonl"
    found = labels_file_problems(
        read_answer_labels,
        path,
        good,
        # From line 3 on.
        {**good, "expected": "Paris"},
        {"fused_query": TAX, "question": "Which city?"},
        {**good, "expectd": "x"},
        {**good, "constraint_type": "place"},
        {**good, "id": "x"},
        {**good, "id": "x", "expected": "unknown"},
        {**good, "question": "  "},
        {**good, "expected": "Unknown"},
        {**good, "language": "klingon"},
        {**good, "expected": 2025},
        {**good, "expected": "Calvan"},  # not a whole word of the query
        {**good, "expected": "未知", "question": ""},
    )
    assert (
        f"{path}:3: expected: 'Paris' is not in the fused query: copy a span of it, or write "
        "`unknown`" in found
    )
    assert f"{path}:4: expected: missing" in found
    assert any(p.startswith(f"{path}:5: expectd: unknown field") for p in found)
    assert any(p.startswith(f"{path}:6: constraint_type: must be one of time, ") for p in found)
    assert f"{path}:8: id: duplicate: 'x' is also on line 7" in found
    assert f"{path}:9: question: empty" in found
    assert f"{path}:10: expected: write `unknown` exactly, got 'Unknown'" in found
    assert any(p.startswith(f"{path}:11: language: unknown language 'klingon'") for p in found)
    assert f"{path}:12: expected: must be a string, got int" in found
    assert any(p.startswith(f"{path}:13: expected: 'Calvan' is not in") for p in found)
    assert f"{path}:14: expected: write `unknown` exactly, got '未知'" in found
    assert f"{path}:14: question: empty" in found
    assert not any(p.startswith(f"{path}:7:") for p in found)
    assert_refuses_missing_and_empty(read_answer_labels, tmp_path)


# -- the command line --------------------------------------------------------------------------


def _scripted_answerer(monkeypatch, script: Callable[[ChatRequest], str]) -> dict[str, object]:
    """`cts answerer calibrate`'s engines replaced by a scripted answerer; what it was opened
    with."""
    return scripted_role(monkeypatch, cts.eval.audit.answerer_calibration, "user_answerer", script)


def test_cts_answerer_calibrate_end_to_end(tmp_path, monkeypatch, small):
    monkeypatch.setenv("COLUMNS", "200")
    opened = _scripted_answerer(monkeypatch, over_sharer)
    out = tmp_path / "figures" / "answerer.json"
    done = calibrate_cli("answerer", small, out, tmp_path / "responses.sqlite")
    assert done.exit_code == 0, done.output
    # The user_answerer role alone, never through the response cache, at its own sampling.
    requests = calibration_requests(opened, "user_answerer")
    assert len(requests) == 6
    # And a span constraint.
    assert {r.output.kind for r in requests} == {"regex"}
    # The over-sharer's figures, worked out in test_an_answerer_that_over_discloses.
    assert "| exact match (normalised) | 0.0% (0) | 6 |" in done.output
    assert "| containment match (the answer holds the expected value) | 66.7% (4) | 6 |" in (
        done.output
    )
    assert "| false answer (a value where `unknown` was expected) | 100.0% (2) | 2 |" in (
        done.output
    )
    assert "| over-disclosure (a value answer giving a value not asked for) | 100.0% (4) | 4 |" in (
        done.output
    )
    assert "(smollm2-135m-answerer)" in done.output
    assert "- e [zh, untyped] contained: `是哪一年的标准？` expected `2025年`, answered " in (
        done.output
    )
    document = json.loads(out.read_text())
    assert document["user_answerer"] == "smollm2-135m-answerer"
    assert document["answerer"] == "extractive" and document["seed"] == 0
    assert document["figures"]["over_disclosure"] == {"n": 4, "count": 4, "share": 1.0}
    assert document["by_language"]["zh"]["false_answer"] == {"n": 1, "count": 1, "share": 1.0}
    assert [v["outcome"] for v in document["verdicts"]] == [
        "contained",
        "contained",
        "false answer",
        "contained",
        "contained",
        "false answer",
    ]
    assert document["verdicts"][4]["disclosed"] == ["溪川市"]


def test_cts_answerer_calibrate_on_the_shipped_set(tmp_path, monkeypatch):
    opened = _scripted_answerer(monkeypatch, lambda request: json.dumps({"answer": "unknown"}))
    done = CliRunner().invoke(
        app,
        ["answerer", "calibrate", "--set", "clarification.answerer=abstractive", "--cases", "3"],
    )
    assert done.exit_code == 0, done.output
    assert {r.output.kind for r in opened["engine"].requests} == {"json"}  # type: ignore[attr-defined]
    # Always `unknown`: right on the 64 unknown rows only (64/170 = 37.6%); every value row
    # a false unknown; nothing answered, so no over-disclosure share.
    assert "| exact match (normalised) | 37.6% (64) | 170 |" in done.output
    assert "| false unknown (`unknown` where a value was expected) | 100.0% (106) | 106 |" in (
        done.output
    )
    assert "| over-disclosure (a value answer giving a value not asked for) | n/a | 0 |" in (
        done.output
    )
    assert "abstractive answerer, seed 0" in done.output
    assert "- … 103 more (--out lists every answer)" in done.output


def test_cts_answerer_calibrate_names_a_bad_labels_file_before_loading_a_model(
    tmp_path, monkeypatch
):
    opened = _scripted_answerer(monkeypatch, shy)
    bad = tmp_path / "labels.jsonl"
    bad.write_text(json.dumps({"fused_query": TAX, "question": "Which city?", "expected": "X"}))
    done = CliRunner().invoke(app, ["answerer", "calibrate", "--labels", str(bad)])
    assert done.exit_code == 2
    assert "dataset error" in done.output
    assert f"{bad}:1: expected: 'X' is not in the fused query" in done.output
    assert opened == {}


def test_the_result_document_is_plain_json(small):
    result = run(shy, read_answer_labels(small))
    document = json.loads(json.dumps(result.as_dict()))
    assert document["figures"]["false_unknown"] == {"n": 4, "count": 2, "share": 0.5}
    assert document["by_constraint_type"]["untyped"]["exact"]["count"] == 4
