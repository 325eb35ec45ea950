"""Every rule a blurred query must pass (cts/eval/construct/checks.py), each fed a row that
breaks it."""

from __future__ import annotations

import pytest

from cts.agents.fuser import StatedConstraint
from cts.eval.construct.checks import (
    REASONS,
    Recovery,
    overlaps,
    question_rejections,
    recovery_rejections,
    removed_rejections,
    span_rejections,
)
from cts.eval.data.schema import Instance, normal_form

FUSED = (
    "Which onboard services are offered on the night trains between Kelbridge and Tornhaven "
    "in 2025?"
)
YEAR = StatedConstraint(type="time", span="2025")
NIGHT = StatedConstraint(type="scope", span="night")


def reasons(fused: str, blurred: str, removed: list[StatedConstraint]) -> list[str]:
    found = span_rejections(fused, blurred, removed) + question_rejections(fused, blurred, removed)
    assert {r.reason for r in found} <= set(REASONS)
    return [r.reason for r in found]


def test_a_clean_blur_passes_every_rule() -> None:
    blurred = "Which onboard services are offered on the trains between Kelbridge and Tornhaven?"
    assert reasons(FUSED, blurred, [YEAR, NIGHT]) == []
    assert (
        reasons(
            "溪川市2025年公租房申请的收入标准是多少？",
            "溪川市公租房申请的收入标准是多少？",
            [StatedConstraint(type="time", span="2025年")],
        )
        == []
    )


def test_a_span_the_fused_query_does_not_hold_is_rejected() -> None:
    assert "span_not_in_fused" in reasons(
        FUSED, FUSED.replace(" in 2025", ""), [StatedConstraint(type="time", span="2024")]
    )


@pytest.mark.parametrize(
    "blurred",
    [
        FUSED.replace("night ", ""),  # the year stayed
        FUSED.replace("night ", "").replace("2025", "２０２５"),  # full-width digits are the same
    ],
)
def test_a_span_still_in_the_blurred_query_is_rejected(blurred: str) -> None:
    assert reasons(FUSED, blurred, [YEAR]) == ["span_still_in_blurred"]


def test_spans_compare_folded_for_width_case_and_whitespace() -> None:
    assert normal_form("Ｋｅｌｂｒｉｄｇｅ  TRAINS") == "kelbridge trains"
    fused = "Korvex Aura Pro battery life"
    assert reasons(
        fused, "korvex aura   PRO battery", [StatedConstraint(type="entity", span="Aura Pro")]
    ) == ["span_still_in_blurred"]
    # The schema compares a dataset's spans the same way.
    with pytest.raises(ValueError, match="still in blurred_query"):
        Instance(
            id="x",
            blurred_query="korvex aura PRO battery",
            fused_query=fused,
            removed_constraints=[{"type": "entity", "span": "Aura Pro"}],
        )


@pytest.mark.parametrize(
    ("blurred", "reason"),
    [
        ("   ", "empty"),
        (FUSED + "  ", "unchanged"),
        ("Night trains?", "too_short"),
        ("夜车？", "too_short"),
        ("2025, 2022, 2023, 2024, 2026, 2027, 2028?", "rewritten"),
        ("How do I cook pasta at home tonight?", "rewritten"),
    ],
)
def test_a_blurred_query_that_is_no_question_is_rejected(blurred: str, reason: str) -> None:
    assert reason in reasons(FUSED, blurred, [YEAR])


@pytest.mark.parametrize(
    ("fused", "blurred", "span", "why"),
    [
        # The preposition that served the year is left at the end.
        (FUSED, FUSED.replace(" 2025", ""), "2025", "ends with 'in'"),
        # ... or runs into what followed the span.
        (
            "What does the Pro plan cost in 2024 for students?",
            "What does the Pro plan cost in for students?",
            "2024",
            "'in for' where a span was",
        ),
        ("溪川市的公租房标准是多少？", "的公租房标准是多少？", "溪川市", "starts with '的'"),
        ("音乐节在2024年举办吗", "音乐节举办在", "2024年", "ends with '在'"),
        (FUSED, FUSED.replace(" in 2025", " ,"), "2025", "a space before punctuation"),
        (FUSED, FUSED.replace(" in 2025", ",?"), "2025", "doubled punctuation"),
        # The span starts or ends inside a word: the rest of the word is left.
        ("Which FY2025 grants?", "Which FY grants?", "2025", "'2025' cuts 'FY2025'"),
        ("Caldmoor's trains?", "'s trains?", "Caldmoor", "'Caldmoor' cuts \"Caldmoor's\""),
        # CJK units are characters: a word the span cuts is one known to be a word.
        ("资助额度 2025年度", "资助额度 度", "2025年", "'2025年' cuts '年度'"),
        ("专家共识2025年版征求意见稿", "专家共识版征求意见稿", "2025年", "'2025年' cuts '年版'"),
    ],
)
def test_words_left_where_a_span_was_are_dangling(
    fused: str, blurred: str, span: str, why: str
) -> None:
    found = question_rejections(fused, blurred, [StatedConstraint(type="time", span=span)])
    assert ("dangling", why) in [(r.reason, r.detail) for r in found]


@pytest.mark.parametrize(
    ("fused", "blurred", "span"),
    [
        ("云川师范大学2025年公费师范生招生计划", "云川师范大学公费师范生招生计划", "2025年"),
        ("溪川市2025年公租房申请收入标准多少", "2025年公租房申请收入标准多少", "溪川市"),
        ("鹤汀春茶产量 2023年", "鹤汀春茶产量", "2023年"),
        ("Kelbridge night trains in 2024-25?", "Kelbridge night trains?", "in 2024-25"),
        ("What did the Pro plan cost in 2024?", "What did the plan cost in 2024?", "Pro"),
    ],
)
def test_a_span_of_whole_words_or_characters_cuts_nothing(
    fused: str, blurred: str, span: str
) -> None:
    assert reasons(fused, blurred, [StatedConstraint(type="time", span=span)]) == []


def test_the_removed_constraints_are_the_drawn_ones_as_pairs() -> None:
    assert removed_rejections([YEAR, NIGHT], [NIGHT, YEAR]) == []
    swapped = [
        StatedConstraint(type="scope", span="2025"),
        StatedConstraint(type="time", span="night"),
    ]
    for said in (swapped, [YEAR], [YEAR, NIGHT, StatedConstraint(type="time", span="in")]):
        assert [r.reason for r in removed_rejections([YEAR, NIGHT], said)] == ["not_the_targets"]
    (missing,) = removed_rejections([YEAR, NIGHT], [YEAR])
    assert missing.detail == "not said removed: scope 'night'; not drawn: none"


def test_recoverability_needs_the_span_from_the_fused_query_and_unknown_from_the_blurred() -> None:
    asked = "Which time or date do you mean?"
    good = Recovery("time", "2025", asked, from_fused="2025", from_blurred="unknown")
    assert recovery_rejections([good]) == []
    lost = Recovery("time", "2025", asked, from_fused="unknown", from_blurred="unknown")
    assert [r.reason for r in recovery_rejections([lost])] == ["not_recoverable"]
    elsewhere = Recovery("time", "2025", asked, from_fused="night trains", from_blurred="unknown")
    assert [r.reason for r in recovery_rejections([elsewhere])] == ["not_recoverable"]
    leaked = Recovery("time", "2025", asked, from_fused="in 2025", from_blurred="trains")
    assert [r.reason for r in recovery_rejections([leaked])] == ["leaks"]


def test_an_answer_overlaps_a_span_by_a_shared_word_or_character() -> None:
    assert overlaps("the night trains", "night")
    assert overlaps("２０２５年", "2025年")
    assert not overlaps("unknown", "unknown")
    assert not overlaps("Kelbridge", "Tornhaven")
