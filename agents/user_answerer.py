"""The User Answerer: sees the fused query and one question only; answers exactly `unknown` or
a value.

`extractive` (the default): the value is a contiguous span of the fused query. The output
constraint itself is built from the fused query, so the answer cannot contain anything the user
did not say; it is re-checked anyway. `abstractive` (an option): the value is worded freely, and
`unsupported_words` flags its content words that the fused query does not contain.

A span is made of units: each CJK character is one unit, and each run of letters/digits (with
joiners such as `-` `.` `'` `/` `+` `&` inside it, e.g. `GPT-4o`, `3.5`, `TCP/IP`) is one unit.
Between two consecutive units a span keeps the fused query's own separator text exactly (`, `,
a space, nothing between CJK characters), so `iPhone 15 Pro` and `2023年` can be given but
`iPhone15` cannot; a span never starts or ends with a separator. `SpanLimits` caps its length."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from agents.prompts import render
from agents.types import UNKNOWN
from serving.engine import ChatModel
from serving.errors import ConstrainedOutputError
from serving.types import ChatRequest, JsonSchemaOutput, RegexOutput, RoleSampling, Sampling

# CJK ideographs: Extension A, the unified block, compatibility ideographs, Extensions B-H.
_CJK_RANGES = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_CJK = re.compile(f"[{_CJK_RANGES}]")
# Letters and digits of any script but CJK (which is one unit per character) and `_`.
_ALNUM = f"[^\\W_{_CJK_RANGES}]"
# A unit: one CJK character, or a letter/digit run whose joiners sit between two alphanumerics
# (so `GPT-4o` is one unit, while the `,` of `Stockholm,` stays a separator).
_UNIT = re.compile(f"[{_CJK_RANGES}]|{_ALNUM}+(?:[-.'’/+&]{_ALNUM}+)*")


@dataclass(frozen=True)
class SpanLimits:
    """How long an extractive answer may be: at most `max_words` letter/digit units and at
    most `max_cjk_chars` CJK characters (a mixed span must satisfy both)."""

    max_words: int = 16
    max_cjk_chars: int = 32

    def __post_init__(self) -> None:
        if self.max_words < 1 or self.max_cjk_chars < 1:
            raise ValueError(f"span limits must be at least 1, got {self}")


def _units(fused_query: str) -> list[tuple[str, str]]:
    """The fused query's units, each with the separator text that follows it up to the next
    unit ("" after the last one)."""
    matches = list(_UNIT.finditer(fused_query))
    units = []
    for i, m in enumerate(matches):
        nxt = matches[i + 1].start() if i + 1 < len(matches) else m.end()
        units.append((m.group(), fused_query[m.end() : nxt]))
    return units


def _runs(fused_query: str, limits: SpanLimits) -> Iterator[list[tuple[str, str]]]:
    """Per start unit, the longest run of units from it within both caps. Every span is a
    prefix of one of these runs, since shortening a run never breaks a cap."""
    units = _units(fused_query)
    for start in range(len(units)):
        words = cjk = 0
        end = start
        while end < len(units):
            if _CJK.fullmatch(units[end][0]):
                cjk += 1
            else:
                words += 1
            if words > limits.max_words or cjk > limits.max_cjk_chars:
                break
            end += 1
        yield units[start:end]


# Only what is special in a regex is escaped, and whitespace controls become their letter
# escapes: `re.escape` also escapes spaces and `#&~`, which xgrammar warns about, and puts
# literal newlines into the pattern.
_ESCAPES = {c: "\\" + c for c in "\\.^$*+?{}[]|()"} | {
    "\n": "\\n",
    "\t": "\\t",
    "\r": "\\r",
    "\f": "\\f",
    "\v": "\\v",
}


def _escape(text: str) -> str:
    return "".join(_ESCAPES.get(c, c) for c in text)


# Cached: every turn of a dialogue, and every seed, asks about the same fused query, and
# building the pattern was a visible share of the pipeline's per-call overhead.
@functools.lru_cache(maxsize=1024)
def span_regex(fused_query: str, limits: SpanLimits = SpanLimits()) -> str:
    """`unknown`, or any span of the fused query within `limits`.

    One alternative per start unit: the longest run from it as a nested-optional chain
    (`a(?: b(?:, c)?)?`), so the pattern grows linearly with the query, not with the number of
    spans; identical chains (a repeated phrase) appear once."""
    alternatives = []
    for run in _runs(fused_query, limits):  # never empty: every cap admits one unit
        nested = _escape(run[-1][0])
        for unit, sep in reversed(run[:-1]):
            nested = f"{_escape(unit)}(?:{_escape(sep)}{nested})?"
        alternatives.append(nested)
    return "|".join([UNKNOWN, *dict.fromkeys(alternatives)])


def spans(fused_query: str, limits: SpanLimits = SpanLimits()) -> set[str]:
    """Every span of the fused query within `limits` (what `span_regex` allows besides
    `unknown`)."""
    return set(_spans(fused_query, limits))


@functools.lru_cache(maxsize=1024)  # as span_regex: one fused query, every turn and seed
def _spans(fused_query: str, limits: SpanLimits) -> frozenset[str]:
    found: set[str] = set()
    for run in _runs(fused_query, limits):
        text = ""
        for unit, sep in run:
            text += unit
            found.add(text)
            text += sep
    return frozenset(found)


def is_span(answer: str, fused_query: str, limits: SpanLimits = SpanLimits()) -> bool:
    """Whether `span_regex(fused_query, limits)` accepts `answer` (checked directly, so the
    re-check does not depend on the regex it re-checks)."""
    return answer == UNKNOWN or answer in _spans(fused_query, limits)


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


#: Room for the longest answer either mode allows: a span within `SpanLimits`, or FreeAnswer.
SAMPLING = RoleSampling(max_tokens=64)


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


# What a free-worded "I don't know" looks like: the prompt asks for exactly `unknown`, but a
# model adds a full stop or capitalises it, and a Chinese reply says it in Chinese.
_UNKNOWN_REPLIES = frozenset({UNKNOWN, "未知", "不知道"})
_TRAILING = " \t\n.。!！"


def means_unknown(text: str) -> bool:
    """Whether an abstractive reply is `unknown` in another dress: any case, a trailing full
    stop or exclamation mark, or 未知 / 不知道."""
    return text.strip().rstrip(_TRAILING).strip().lower() in _UNKNOWN_REPLIES


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
    limits: SpanLimits = SpanLimits(),
) -> str:
    """`limits` caps an extractive answer's length (the abstractive mode ignores it)."""
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
        return UNKNOWN if means_unknown(text) else text
    system, user = render("user_answerer", language, fused_query=fused_query, question=question)
    response = await engine.chat(
        ChatRequest(
            messages=(system, user),
            sampling=sampling,
            output=RegexOutput(pattern=span_regex(fused_query, limits)),
        )
    )
    text = response.text.strip()
    if not is_span(text, fused_query, limits):
        raise ConstrainedOutputError("user answerer invented text outside the fused query", text)
    return text
