"""The User Answerer: extractive spans (what the regex admits, what the re-check admits) and the
abstractive option."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import re

import pytest

from cts.agents import user_answerer
from cts.agents.user_answerer import SpanLimits, is_span, span_regex, spans
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.serving.errors import ConstrainedOutputError
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import Sampling

SAMPLING = Sampling(max_tokens=64)


def test_span_regex_allows_exactly_unknown_or_spans():
    pattern = re.compile(user_answerer.span_regex("night train tickets from Esker in 2024"))
    for ok in [
        "unknown",
        "2024",
        "in 2024",
        "night train",
        "Esker",
        "train tickets from Esker in 2024",
    ]:
        assert pattern.fullmatch(ok), ok
    for bad in ["2023", "Unknown", "train night", "Esker 2024", "tickets to Esker", ""]:
        assert not pattern.fullmatch(bad), bad
    zh = re.compile(user_answerer.span_regex("华岳医学会2023年版共识"))
    assert zh.fullmatch("2023年版") and zh.fullmatch("unknown") and not zh.fullmatch("2024年")


MIXED = "我想买一部 iPhone 15 Pro，256GB 的，在北京 Apple Store 提货"
LONG_EN = (
    "I need the official 2025 fee schedule for the Cambridge University Press English "
    "placement exam taken online from outside the United Kingdom, thanks"
)

#: (fused query, answers that must be producible, answers that must not be).
CASES = [
    (
        "我想报考北京大学人工智能专业的研究生",
        ["北京大学人工智能专业", "北京大学", "研究生", "我想报考北京大学人工智能专业的研究生"],
        ["北京大学 人工智能专业", "清华大学", "专业人工智能", "北京大学人工智能专业研究生"],
    ),
    (
        MIXED,
        ["iPhone 15 Pro", "iPhone", "15", "Pro，256GB", "256GB 的", "一部 iPhone", "Apple Store"],
        ["iPhone15", "iPhone 15 Pro 256GB", "iPhone 15 Pro，", "，256GB", "Pro 256GB", "iPhon"],
    ),
    (
        LONG_EN,
        [
            # 14 words: a long span, still within the default cap of 16.
            "official 2025 fee schedule for the Cambridge University Press English placement "
            "exam taken online",
            "United Kingdom",
            "Kingdom, thanks",
        ],
        ["Kingdom thanks", "Kingdom,", "Oxford University Press", "exam online", "2024"],
    ),
    (
        "GPT-4o vs Claude 3.5 Sonnet: which is cheaper per 1M tokens?",
        ["GPT-4o", "Claude 3.5 Sonnet", "3.5", "Sonnet: which", "1M tokens"],
        ["GPT", "4o", "GPT-4", "Sonnet:", "tokens?", "Claude 3.5Sonnet", "GPT-5"],
    ),
    (
        "2023年北京新能源汽车补贴政策",
        ["2023年", "2023", "北京新能源汽车", "2023年北京新能源汽车补贴政策"],
        ["2024年", "2023 年", "年2023", "上海"],
    ),
    (
        "laptops with a 3.5 GHz CPU for O'Neill's TCP/IP course in the U.S.",
        ["3.5 GHz", "O'Neill's TCP/IP course", "U.S", "U.S.", "the U.S.", "TCP/IP"],
        ["3.5GHz", "U.S.,", "O", "Neill", "TCP", "IP course", ".", "S."],
    ),
    (
        "Best hotels in Stockholm, Sweden (near the station) for 2 nights",
        ["Stockholm", "Stockholm, Sweden", "Sweden (near the station", "station) for 2"],
        ["Stockholm,", "(near", "Stockholm Sweden", "hotel"],
    ),
    # Symbols attached to a value: sign, currency, percent, degree, a name's own `+ # .`.
    (
        "C++ or C# jobs paying $100k+ in the U.S. for .NET developers, 50% remote, at -5°F",
        [
            *("C++", "C#", "C++ or C#", "$100k+", "100k+", ".NET", ".NET developers", "50%"),
            *("50% remote", "-5°F", "5°F", "-5°", "U.S.", "at -5°F"),
        ],
        ["C", "C+", "NET", "100k", "$100k", "50%%", "%", "-5°F.", "remote,", "C#,", "$", "°F"],
    ),
    (
        "哈尔滨明天-5°C吗？想看《个人信息保护法》第3条，月薪3000-5000元的岗位，涨幅50%",
        [
            *("-5°C", "《个人信息保护法》", "个人信息保护法", "3000", "5000元", "3000-5000元"),
            *("50%", "第3条", "涨幅50%"),
        ],
        ["-5000", "3000-", "个人信息保护法》，", "《》", "吗？", "？想看", "5°C吗？", "300"],
    ),
    # Japanese kana and Korean hangul are units, like Chinese characters.
    (
        "東京のホテルと서울의 호텔, budget ¥20000 or ₩150000",
        ["ホテル", "東京のホテル", "東京", "서울", "서울의 호텔", "호텔", "¥20000", "₩150000"],
        ["서울의호텔", "東京 のホテル", "호텔,", "¥", "budget ¥"],
    ),
]


@pytest.mark.parametrize(("fused", "producible", "not_producible"), CASES)
def test_real_values_are_producible_and_nothing_else(fused, producible, not_producible):
    pattern = re.compile(span_regex(fused))
    for answer in producible:
        assert pattern.fullmatch(answer) and is_span(answer, fused), answer
    for answer in not_producible:
        assert not pattern.fullmatch(answer) and not is_span(answer, fused), answer


@pytest.mark.parametrize(
    ("fused", "limits", "within", "over"),
    [
        ("a b c d e f", SpanLimits(max_words=3), "b c d", "b c d e"),
        ("我想报考北京大学的研究生", SpanLimits(max_cjk_chars=4), "北京大学", "北京大学的"),
        # A mixed span must satisfy both caps.
        (MIXED, SpanLimits(max_words=2, max_cjk_chars=2), "一部 iPhone 15", "买一部 iPhone"),
        (MIXED, SpanLimits(max_words=2, max_cjk_chars=2), "一部 iPhone 15", "一部 iPhone 15 Pro"),
        # Kana and hangul count as CJK characters; attached symbols are not units.
        ("東京のホテルを探す", SpanLimits(max_cjk_chars=3), "ホテル", "のホテル"),
        ("서울의 호텔", SpanLimits(max_cjk_chars=2), "서울", "서울의"),
        ("at -5°C or 50%", SpanLimits(max_words=2), "-5°C", "-5°C or"),
    ],
)
def test_custom_limits_cap_the_span(fused, limits, within, over):
    pattern = re.compile(span_regex(fused, limits))
    assert pattern.fullmatch(within) and is_span(within, fused, limits)
    assert not pattern.fullmatch(over) and not is_span(over, fused, limits)
    assert is_span(over, fused)  # the defaults admit it


def test_default_limits_admit_long_values():
    words = " ".join(f"w{i}" for i in range(40))
    assert is_span(" ".join(f"w{i}" for i in range(3, 19)), words)  # 16 words
    assert not is_span(" ".join(f"w{i}" for i in range(3, 20)), words)  # 17
    chars = "".join(chr(0x4E00 + i) for i in range(60))
    assert is_span(chars[5:37], chars) and not is_span(chars[5:38], chars)  # 32 / 33


def test_span_limits_are_frozen_and_positive():
    assert SpanLimits() == SpanLimits(max_words=16, max_cjk_chars=32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        SpanLimits().max_words = 3  # type: ignore[misc]
    with pytest.raises(ValueError):
        SpanLimits(max_words=0)
    with pytest.raises(ValueError):
        SpanLimits(max_cjk_chars=0)


def test_regex_is_one_chain_per_start_and_deduplicated():
    fused = "the cat and the cat and the cat"
    alternatives = span_regex(fused, SpanLimits(max_words=3)).split("|")
    assert alternatives[0] == "unknown"
    assert len(alternatives) == len(set(alternatives))
    # "the cat and" / "cat and the" / "and the cat" / "the cat" / "cat": five distinct chains.
    assert len(alternatives) == 1 + 5
    assert span_regex("") == span_regex(" ,;? ") == "unknown"


def test_separators_with_regex_metacharacters_and_newlines_are_escaped():
    fused = "C++ (beta) [x] a|b $5.99?\nprice*2 {n} ^top\tend"
    pattern = span_regex(fused)
    assert "\n" not in pattern and "\t" not in pattern and "\\ " not in pattern
    compiled = re.compile(pattern)
    for answer in ["beta) [x] a|b $5.99", "5.99?\nprice*2 {n", "top\tend", "C++ (beta"]:
        assert compiled.fullmatch(answer), answer
    for answer in ["C++", "a", "b", "C", "beta x"]:
        assert bool(compiled.fullmatch(answer)) == is_span(answer, fused), answer


_PIECES = [
    *"the of 2024 iPhone Pro GPT-4o 3.5 U.S O'Neill TCP/IP R&D C+ GHz naïve Zürich".split(),
    *"C++ C# 18+ .NET -5°C 50% $100 U.S. 3000-5000 2024-05-01 《法》 ホテル 서울의".split(),
    *"北京大学人工智能年的",
]
_SEPARATORS = [" ", "  ", ", ", "，", "。", "", "\n", " (", ") ", ": ", " - ", "|", "$", "*", "."]
_SEPARATORS += ["-", "%", "°", "#", "+", "《", "》", " ¥", "~"]


def _random_query(rng: random.Random) -> str:
    text = rng.choice(["", "(", "“"])
    for _ in range(rng.randint(1, 14)):
        text += rng.choice(_PIECES) + rng.choice(_SEPARATORS)
    return text


def test_is_span_accepts_exactly_what_the_regex_accepts():
    """On random mixed queries and limits: every span, random substrings of the query (most
    of them not spans) and perturbed spans get the same verdict from both."""
    rng = random.Random(2024)
    checked = accepted = 0
    for _ in range(300):
        fused = _random_query(rng)
        limits = SpanLimits(max_words=rng.randint(1, 5), max_cjk_chars=rng.randint(1, 5))
        pattern = re.compile(span_regex(fused, limits))
        candidates = set(spans(fused, limits)) | {"unknown", "", fused, fused.strip()}
        for _ in range(30):
            i, j = sorted(rng.sample(range(len(fused) + 1), 2))
            candidates.add(fused[i:j])
        for span in list(candidates):
            if span:
                k = rng.randrange(len(span))
                candidates |= {span[:k] + span[k + 1 :], span + " ", span.replace(" ", "")}
        for answer in candidates:
            verdict = is_span(answer, fused, limits)
            assert bool(pattern.fullmatch(answer)) == verdict, (fused, limits, answer)
            checked += 1
            accepted += verdict
    assert accepted > 1000 and checked - accepted > 1000  # both verdicts well exercised


def test_only_substrings_of_the_fused_query_pass():
    """Nothing outside the fused query passes: on random mixed queries every span is a
    substring, and every substring of the query (all of them) and a perturbation of each gets
    the same verdict from the regex and the re-check."""
    rng = random.Random(26)
    for _ in range(60):
        fused = _random_query(rng)[:48]
        limits = SpanLimits(max_words=rng.randint(1, 6), max_cjk_chars=rng.randint(1, 6))
        pattern = re.compile(span_regex(fused, limits))
        assert all(span in fused for span in spans(fused, limits)), fused
        for i in range(len(fused)):
            for j in range(i + 1, len(fused) + 1):
                for answer in (fused[i:j], fused[i:j] + rng.choice("+#%.-x年")):
                    verdict = is_span(answer, fused, limits)
                    assert bool(pattern.fullmatch(answer)) == verdict, (fused, answer)
                    assert not verdict or answer in fused, (fused, answer)


def test_user_answerer_rechecks_the_span():
    engine = ScriptedEngine(lambda r: "Paris")  # as if a server ignored the constraint
    with pytest.raises(ConstrainedOutputError):
        asyncio.run(user_answerer.answer(engine, "hotels in Lyon", "Which city?", "en", SAMPLING))


def test_user_answerer_applies_its_limits_to_the_regex_and_the_recheck():
    fused = "cheap hotels in Lyon old town"
    limits = SpanLimits(max_words=2)
    engine = ScriptedEngine(lambda r: "Lyon old")
    text = asyncio.run(user_answerer.answer(engine, fused, "Where?", "en", SAMPLING, limits=limits))
    assert text == "Lyon old"
    assert engine.requests[0].output.pattern == span_regex(fused, limits)
    engine = ScriptedEngine(lambda r: "Lyon old town")  # a span, but over the cap
    with pytest.raises(ConstrainedOutputError):
        asyncio.run(user_answerer.answer(engine, fused, "Where?", "en", SAMPLING, limits=limits))
    default = asyncio.run(user_answerer.answer(engine, fused, "Where?", "en", SAMPLING))
    assert default == "Lyon old town"


@pytest.mark.slow
def test_user_answerer_is_extractive_on_random_cases(tiny_engine):
    # 30 cases on the real model; the regex itself is checked exhaustively above, without one.
    instances = load_instances(DatasetSource(path="sample", split=None))
    questions = [
        "Which year do you mean?",
        "Which city or country?",
        "Which product exactly?",
        "What price range?",
        "Do you mean a specific season?",
        "For whom is it?",
        "Which organisation?",
        "What exactly do you mean by that term?",
        "哪一年？",
        "在哪个城市？",
    ]
    rng = random.Random(100)
    cases = [(rng.choice(instances), rng.choice(questions)) for _ in range(30)]
    sampling = Sampling(max_tokens=32, temperature=0.7, seed=7)

    async def go():
        return await asyncio.gather(
            *(
                user_answerer.answer(tiny_engine, i.fused_query, q, i.language, sampling)
                for i, q in cases
            )
        )

    answers = asyncio.run(go())
    for (instance, _), text in zip(cases, answers, strict=True):
        assert text == "unknown" or user_answerer.is_span(text, instance.fused_query), text


def test_unsupported_words_flag_what_the_fused_query_does_not_say():
    fused = "Best electric SUVs of 2023 in Norway"
    assert user_answerer.unsupported_words("unknown", fused) == []
    assert user_answerer.unsupported_words("the 2023 ones, in Norway please", fused) == []
    assert user_answerer.unsupported_words("Sweden, last year", fused) == ["sweden", "last", "year"]
    assert user_answerer.unsupported_words("2023年的", "2023年北京的电动车") == []
    assert user_answerer.unsupported_words("上海", "2023年北京的电动车") == ["上", "海"]


def test_abstractive_answers_are_free_text_and_unknown_is_normalised():
    engine = ScriptedEngine(lambda r: json.dumps({"answer": "Unknown"}))
    text = asyncio.run(
        user_answerer.answer(engine, "hotels in Lyon", "When?", "en", SAMPLING, mode="abstractive")
    )
    assert text == "unknown"
    assert "your full intent" in engine.requests[0].messages[0].content
    assert engine.requests[0].output.json_schema["required"] == ["answer"]


@pytest.mark.parametrize(
    "reply",
    ["Unknown.", "unknown.", "UNKNOWN", " Unknown! ", "unknown。", "未知", "未知。", "不知道"],
)
def test_abstractive_unknown_in_any_dress_is_unknown(reply):
    engine = ScriptedEngine(lambda r: json.dumps({"answer": reply}))
    text = asyncio.run(
        user_answerer.answer(engine, "里昂的酒店", "哪一年？", "zh", SAMPLING, mode="abstractive")
    )
    assert text == "unknown"


@pytest.mark.parametrize("reply", ["Unknown brand", "not unknown", "未知数", "2024."])
def test_abstractive_answers_that_only_contain_unknown_are_kept(reply):
    engine = ScriptedEngine(lambda r: json.dumps({"answer": reply}))
    text = asyncio.run(
        user_answerer.answer(engine, "hotels in Lyon", "When?", "en", SAMPLING, mode="abstractive")
    )
    assert text == reply
