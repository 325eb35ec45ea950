"""The User Answerer: sees the fused query and one question only; answers exactly `unknown` or
a value.

`extractive` (the default): the value is a contiguous span of the fused query. The output
constraint itself is built from the fused query, so the answer cannot contain anything the user
did not say; it is re-checked anyway. `abstractive` (an option): the value is worded freely, and
`unsupported_words` flags its content words that the fused query does not contain."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from agents.prompts import render
from agents.types import UNKNOWN
from serving.engine import ChatModel
from serving.errors import ConstrainedOutputError
from serving.types import ChatRequest, JsonSchemaOutput, RegexOutput, Sampling

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


AnswerMode = Literal["extractive", "abstractive"]

# Function words an abstractive answer may add without adding information.
_STOPWORDS = frozenset(
    """a an the of in on at to for from by with and or not no is are was were be been it its
    this that these those i my me we our you your they their he she his her about as into than
    then so do does did just only some any all one which what who when where how yes please
    want looking mean meant""".split()
)
_CJK_FUNCTION_CHARS = frozenset("的了是在和与或我你他她它们这那个要想就也都吧呢吗啊呀不没有")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


class FreeAnswer(BaseModel):
    answer: str = Field(min_length=1, max_length=120)


def _content_units(text: str) -> list[str]:
    """Content words (lower-case, a plural `s` dropped) and CJK content characters."""
    units: list[str] = []
    for word in _WORD.findall(text.lower()):
        if _CJK.search(word):
            units.extend(c for c in word if _CJK.match(c) and c not in _CJK_FUNCTION_CHARS)
        else:
            word = word[:-1] if len(word) > 3 and word.endswith("s") else word
            if word not in _STOPWORDS:
                units.append(word)
    return units


def unsupported_words(answer: str, fused_query: str) -> list[str]:
    """The answer's content words the fused query does not contain (none for `unknown`)."""
    if answer == UNKNOWN:
        return []
    known = set(_content_units(fused_query))
    return list(dict.fromkeys(u for u in _content_units(answer) if u not in known))


async def answer(
    engine: ChatModel,
    fused_query: str,
    question: str,
    language: str,
    sampling: Sampling,
    mode: AnswerMode = "extractive",
) -> str:
    if mode == "abstractive":
        system, user = render(
            "user_answerer_abstractive", language, fused_query=fused_query, question=question
        )
        reply = await engine.chat(
            ChatRequest(
                messages=(system, user), sampling=sampling, output=JsonSchemaOutput.of(FreeAnswer)
            )
        )
        text = FreeAnswer.model_validate(reply.parsed).answer.strip()
        return UNKNOWN if text.lower() == UNKNOWN else text
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
