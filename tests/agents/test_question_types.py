"""The question-type classifiers: multi-label keyword rules with en/zh parity, the model
classifier's schema and normalisation, and the hand-labelled table they are measured on."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from bench.question_types import exact_accuracy, load_table, scores
from cts.agents.question_type import (
    MAX_TYPES,
    QUESTION_TYPES,
    RULES,
    classify,
    classify_with_model,
    normalise,
    types_schema,
)
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import Sampling


@pytest.mark.parametrize(
    ("question", "types"),
    [
        # The traps of the first-match rules: every type is found, and word senses are kept.
        ("Which city and which year?", ["time", "region"]),
        ("Which area of AI are you interested in?", ["scope"]),
        ("Are you interested in the state of the art or a beginner introduction?", ["scope"]),
        ("Do you want the latest figures?", ["time"]),
        ("需要最新的数据吗？", ["time"]),
        # Other decisions of the labelling guide.
        ("Which state do you live in?", ["region"]),
        ("What is the current state of the project?", ["time"]),
        ("How many years of experience do you need?", ["numeric"]),
        ("How many years back should I search?", ["time", "numeric"]),
        ("Which model of the phone?", ["entity"]),
        ("What kind of laptop are you looking for?", ["scope"]),
        ("你想要哪种笔记本电脑？", ["scope"]),
        ("Which year do you mean?", ["time"]),
        ("你指的是哪一年？", ["time"]),
        ("What do you mean by 'light'?", ["definition"]),
        ("你说的“轻”是什么意思？", ["definition"]),
        ("What is your budget and which brand do you prefer?", ["entity", "numeric"]),
        ("Which streaming service do you use?", ["entity"]),
        ("孩子今年几岁？", ["numeric"]),
        ("你打算几月去？", ["time"]),
        ("Anything else?", ["other"]),
    ],
)
def test_keyword_rules_find_every_type_asked(question, types):
    assert classify(question) == types


@pytest.mark.parametrize(
    ("en", "zh", "types"),
    [
        ("Do you want the latest results?", "你想要最新的结果吗？", ["time"]),
        ("Only recent news?", "只要近期的新闻吗？", ["time", "scope"]),
        ("Which city?", "哪个城市？", ["region"]),
        ("Which state?", "哪个州？", ["region"]),
        ("Domestic or abroad?", "国内还是国外？", ["region"]),
        ("What is your budget?", "你的预算是多少？", ["numeric"]),
        ("How long will you stay?", "你会待多久？", ["numeric"]),
        ("Which field?", "哪个领域？", ["scope"]),
        ("Which aspect?", "哪方面？", ["scope"]),
        ("What kind of phone?", "哪种手机？", ["scope"]),
        ("Which brand?", "哪个品牌？", ["entity"]),
        ("Which company?", "哪家公司？", ["entity"]),
        ("What does this abbreviation mean?", "这个缩写是什么意思？", ["definition"]),
        ("Which city and which year?", "哪个城市、哪一年？", ["time", "region"]),
    ],
)
def test_english_and_chinese_rules_agree(en, zh, types):
    assert classify(en) == types
    assert classify(zh) == types


def test_every_rule_has_both_languages_and_a_known_type():
    for rule in RULES:
        assert rule.kind in QUESTION_TYPES and rule.kind != "other"
        assert rule.en and rule.zh, rule.concept
        re.compile(rule.en)
        re.compile(rule.zh)
    assert {r.kind for r in RULES} == set(QUESTION_TYPES) - {"other"}


def test_normalise_orders_deduplicates_and_keeps_other_alone():
    assert normalise(["numeric", "time", "numeric"]) == ["time", "numeric"]
    assert normalise(["other", "region"]) == ["region"]
    assert normalise(["other"]) == ["other"]
    assert normalise([]) == ["other"]
    with pytest.raises(ValueError, match="unknown"):
        normalise(["place"])


def test_the_labelled_table_is_valid_and_bilingual():
    rows = load_table()
    assert sum(r.language == "en" for r in rows) >= 30
    assert sum(r.language == "zh" for r in rows) >= 30
    assert any(len(r.types) > 1 for r in rows if r.language == "en")
    assert any(len(r.types) > 1 for r in rows if r.language == "zh")
    for r in rows:
        assert r.types and set(r.types) <= set(QUESTION_TYPES), r
        assert list(r.types) == normalise(r.types), r
        assert len(r.types) <= MAX_TYPES


def test_scores_match_a_hand_computation():
    gold = [["time"], ["time", "region"], ["other"]]
    predicted = [["time"], ["region"], ["time"]]
    s = scores(gold, predicted)
    # time: tp 1 (row 1), fn 1 (row 2), fp 1 (row 3).
    assert (s["time"].tp, s["time"].fp, s["time"].fn) == (1, 1, 1)
    assert (s["time"].precision, s["time"].recall, s["time"].f1) == (0.5, 0.5, 0.5)
    assert (s["region"].precision, s["region"].recall, s["region"].f1) == (1.0, 1.0, 1.0)
    assert (s["other"].precision, s["other"].recall, s["other"].f1, s["other"].support) == (
        0.0,
        0.0,
        0.0,
        1,
    )
    assert s["scope"].support == 0 and s["scope"].f1 == 0.0
    # micro: tp 2, fp 1, fn 2 -> P 2/3, R 1/2, F1 4/7.
    assert (s["micro"].tp, s["micro"].fp, s["micro"].fn) == (2, 1, 2)
    assert s["micro"].f1 == pytest.approx(4 / 7)
    assert exact_accuracy(gold, predicted) == pytest.approx(1 / 3)


def test_keyword_rules_keep_their_measured_quality():
    """Micro-F1 over the labelled table was 0.94 when the rules were last extended; a
    regression of the rules (or a relabelling) shows up here."""
    rows = load_table()
    s = scores([r.types for r in rows], [classify(r.question) for r in rows])
    assert s["micro"].f1 >= 0.90


#: Per type, the precision and recall the rules must keep over the whole table (measured when
#: the rules were last extended, less a margin; `python bench/question_types.py` prints them).
#: A micro-F1 alone would let a rare type (region in Chinese, say) collapse unnoticed.
FLOORS = {
    "time": (0.90, 0.95),
    "region": (0.95, 0.95),
    "scope": (0.85, 0.90),
    "entity": (0.65, 0.95),
    "numeric": (0.80, 0.95),
    "definition": (0.90, 0.90),
    "other": (0.75, 0.90),
}


@pytest.mark.parametrize("language", ["en", "zh", None])
@pytest.mark.parametrize("kind", sorted(FLOORS))
def test_keyword_rules_keep_a_floor_per_type(kind, language):
    rows = [r for r in load_table() if language in (None, r.language)]
    s = scores([r.types for r in rows], [classify(r.question) for r in rows])[kind]
    floor_p, floor_r = FLOORS[kind]
    if language is not None and s.support < 10:
        pytest.skip(f"{s.support} {kind} questions in {language}: too few for a floor")
    assert s.precision >= floor_p and s.recall >= floor_r, (
        f"{kind} ({language or 'all'}): P {s.precision:.2f} R {s.recall:.2f} n {s.support}"
    )


@pytest.mark.parametrize(
    "question",
    [
        # Chinese: which city / town / village, province-and-city, prefecture-level city,
        # places as alternatives, where to.
        "哪个市？",
        "你在哪个镇？",
        "你们是哪个村的？",
        "你说的是哪个省市？",
        "是哪个地级市？",
        "北京还是上海？",
        "你想去哪？",
        "美国还是中国的政策？",
        "你说的是朝阳区还是海淀区？",
        "你在上海吗？",
        # English: places as alternatives, where the user is.
        "US or UK?",
        "Are you in London?",
        "Do you want results for the US or for Europe?",
        "Which time zone are you in?",
        "Which part of town are you staying in?",
    ],
)
def test_region_phrasings_of_search_users_are_region(question):
    assert classify(question) == ["region"]


@pytest.mark.parametrize(
    ("question", "types"),
    [
        # A place named as context is not region.
        ("Which Tokyo hotel did you book?", ["entity"]),
        ("北京的房价你想看哪一年的？", ["time"]),
        # Markets and blockchains are no places; pronoun "us" is not the US.
        ("你想投资股市还是楼市？", ["other"]),
        ("哪个市场？", ["entity"]),
        ("Can you tell us or show us an example?", ["other"]),
        ("Which part of the report?", ["scope"]),
        # A place name in a proper noun, "state" as a status, "where in" a text, code's
        # "local", a national team, a site named 去哪儿网 (an outside audit's false positives).
        ("Paris Agreement or Kyoto Protocol?", ["entity"]),
        ("Which state is your application in?", ["other"]),
        ("Where in the document?", ["scope"]),
        ("Which local variable?", ["entity"]),
        ("国家队的比赛是哪天？", ["time"]),
        ("去哪儿网还是携程？", ["entity"]),
        # 周几 / 几时 ask when, not how many.
        ("周几去？", ["time"]),
        ("你们一共几个人？", ["numeric"]),
    ],
)
def test_region_rules_keep_their_traps(question, types):
    assert classify(question) == types


def test_the_model_answers_in_a_schema_and_is_normalised():
    engine = ScriptedEngine(lambda r: json.dumps({"types": ["numeric", "time", "numeric"]}))
    kinds = asyncio.run(
        classify_with_model(engine, "Which year and what budget?", "en", Sampling(max_tokens=48))
    )
    assert kinds == ["time", "numeric"]
    request = engine.requests[0]
    assert request.output.kind == "json"
    items = request.output.json_schema["properties"]["types"]
    assert items["items"]["enum"] == list(QUESTION_TYPES)
    assert (items["minItems"], items["maxItems"]) == (1, MAX_TYPES)
    assert "one to three types" in request.messages[0].content
    assert request.messages[1].content == "Which year and what budget?"
    assert types_schema() == request.output.json_schema


@pytest.mark.slow
def test_the_model_classifier_on_the_tiny_model(tiny_engine):
    async def go():
        return [
            await classify_with_model(tiny_engine, q, lang, Sampling(max_tokens=48))
            for q, lang in (("Which city and which year?", "en"), ("你的预算是多少？", "zh"))
        ]

    for kinds in asyncio.run(go()):
        assert kinds and set(kinds) <= set(QUESTION_TYPES)
        assert kinds == normalise(kinds)
