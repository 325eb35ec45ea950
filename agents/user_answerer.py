"""The User Answerer: sees the fused query and one question only; answers exactly `unknown` or
a contiguous span of the fused query. The output constraint itself is built from the fused
query, so the answer cannot contain anything the user did not say; it is re-checked anyway."""

from __future__ import annotations

import re

from agents.prompts import render
from agents.types import UNKNOWN
from serving.engine import ChatModel
from serving.errors import ConstrainedOutputError
from serving.types import ChatRequest, RegexOutput, Sampling

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def _units(fused_query: str) -> tuple[list[str], str]:
    """Words (characters for Chinese) and the separator that rejoins them."""
    if _CJK.search(fused_query):
        return [c for c in fused_query if not c.isspace()], ""
    return [w.strip(".,;:!?\"'()") for w in fused_query.split()], " "


def span_regex(fused_query: str, max_words: int = 8) -> str:
    """`unknown`, or any run of up to `max_words` consecutive words of the fused query."""
    units, sep = _units(fused_query)
    units = [u for u in units if u]
    alternatives = []
    for start in range(len(units)):
        run = units[start : start + max_words]
        nested = re.escape(run[-1])
        for unit in reversed(run[:-1]):
            nested = (
                f"{re.escape(unit)}(?:{re.escape(sep)}{nested})?"
                if sep
                else f"{re.escape(unit)}(?:{nested})?"
            )
        alternatives.append(nested)
    return "|".join([UNKNOWN, *dict.fromkeys(alternatives)])


def is_span(answer: str, fused_query: str) -> bool:
    units, sep = _units(fused_query)
    return answer in sep.join(u for u in units if u)


async def answer(
    engine: ChatModel, fused_query: str, question: str, language: str, sampling: Sampling
) -> str:
    system, user = render("user_answerer", language, fused_query=fused_query, question=question)
    response = await engine.chat(
        ChatRequest(
            messages=(system, user),
            sampling=sampling,
            output=RegexOutput(pattern=span_regex(fused_query)),
        )
    )
    text = response.text.strip()
    if text != UNKNOWN and not is_span(text, fused_query):
        raise ConstrainedOutputError("user answerer invented text outside the fused query", text)
    return text
