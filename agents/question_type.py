"""Question-type classifier for diagnostics: which kind of missing detail a clarifying question
asks about. Keyword rules in English and Chinese by default (`classify`: no model call,
reproducible); `classify_with_model` asks a model to choose (the `question_classifier` role)."""

from __future__ import annotations

import re
from typing import Literal, cast, get_args

from agents.prompts import render
from serving.engine import ChatModel
from serving.types import ChatRequest, ChoiceOutput, Sampling

QuestionType = Literal["time", "region", "scope", "entity", "numeric", "definition", "other"]
QUESTION_TYPES: tuple[QuestionType, ...] = get_args(QuestionType)

# Checked in this order: the first type whose pattern matches wins (a "which year" question is
# about time, not an entity).
_RULES: list[tuple[QuestionType, str]] = [
    # Not a bare "do you mean": "Which year do you mean?" asks about time.
    (
        "definition",
        r"\bmean by\b|\bmeaning of\b|\bdefin|\brefer(ring)? to\b|what kind of|which sense"
        r"|指的是什么|什么意思|定义|含义|哪种意思",
    ),
    (
        "time",
        r"\bwhen\b|\byear\b|\bdate\b|\bmonth\b|\bseason\b|\bperiod\b|\btime\b|\brecent"
        r"|\blatest\b|\bcurrent\b|\b(19|20)\d\d\b|什么时候|哪一?年|年份|时间|日期|何时|季节|期间",
    ),
    (
        "region",
        r"\bwhere\b|\bcountry\b|\bcity\b|\bregion\b|\blocation\b|\barea\b|\bplace\b"
        r"|\btown\b|\bstate\b|\bprovince\b|哪里|哪儿|国家|城市|地区|省|地点|哪个市",
    ),
    (
        "numeric",
        r"how (many|much)|\bprice\b|\bcost\b|\bbudget\b|\bnumber\b|\bamount\b|\brange\b"
        r"|\bsize\b|\bage\b|多少|几[个岁]|价格|预算|数量|范围内",
    ),
    (
        "scope",
        r"\baspect\b|\bpart\b|\bspecific(ally)?\b|\bfocus\b|\binclude\b|\bonly\b"
        r"|\bin particular\b|方面|范围|具体|哪部分|侧重",
    ),
    (
        "entity",
        r"\bwhich\b|\bwho\b|\bbrand\b|\bmodel\b|\bcompany\b|\borgani[sz]ation\b"
        r"|\bproduct\b|哪个|哪家|哪款|谁|品牌|型号|公司|机构",
    ),
]
_COMPILED = [(kind, re.compile(pattern, re.IGNORECASE)) for kind, pattern in _RULES]


def classify(question: str) -> QuestionType:
    for kind, pattern in _COMPILED:
        if pattern.search(question):
            return kind
    return "other"


async def classify_with_model(
    engine: ChatModel, question: str, language: str, sampling: Sampling
) -> QuestionType:
    system, user = render("question_classifier", language, question=question)
    response = await engine.chat(
        ChatRequest(
            messages=(system, user), sampling=sampling, output=ChoiceOutput(choices=QUESTION_TYPES)
        )
    )
    # The engine has already checked the answer against the choices.
    return cast(QuestionType, response.text.strip())
