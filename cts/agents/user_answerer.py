"""The User Answerer: sees the fused query and one question only; answers exactly `unknown` or
a value.

`extractive` (the default): the value is a contiguous span of the fused query. The output
constraint itself is built from the fused query, so the answer cannot contain anything the user
did not say; it is re-checked anyway. `abstractive` (an option): the value is worded freely, and
`unsupported_words` flags its content words that the fused query does not contain.

A span is made of units: each CJK character (Chinese ideograph, Japanese kana, Korean hangul) is
one unit, and each run of letters/digits (with joiners such as `-` `.` `'` `/` `+` `&` inside
it, e.g. `GPT-4o`, `3.5`, `TCP/IP`) is one unit; a `-` between two digits is not a joiner, so
`3000` can come out of `3000-5000`. Between two consecutive units a span keeps the fused query's
own separator text exactly (`, `, a space, nothing between CJK characters), so `iPhone 15 Pro`
and `2023年` can be given but `iPhone15` cannot. A span starts and ends at a unit, optionally
with the symbols attached to it that belong to the value: before it a sign (`-5°C`), a currency
(`$100`) or an opening title mark (`《`); after it `%` `‰` `°` `.` (`50%`, `U.S.`) or a closing
title mark (`》`). A name's own `.`, `+` and `#` are part of its unit (`.NET`, `C++`, `C#`). Any
other separator never starts or ends a span. `SpanLimits` caps its length."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from cts.agents.prompts import render
from cts.agents.types import UNKNOWN
from cts.serving.engine import ChatModel
from cts.serving.errors import ConstrainedOutputError
from cts.serving.types import ChatRequest, JsonSchemaOutput, RegexOutput, RoleSampling, Sampling

# Scripts written without spaces between words, one unit per character. CJK ideographs:
# Extension A, the unified block, compatibility ideographs, Extensions B-H; Japanese hiragana,
# katakana (with `ー`, without the `・` separator), its phonetic extensions and half-width forms;
# Korean hangul syllables and jamo (Korean puts particles on the word: `서울의` holds `서울`).
_CJK_RANGES = (
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
    "\u3041-\u309f\u30a0-\u30fa\u30fc-\u30ff\u31f0-\u31ff\uff66-\uff9f"
    "\uac00-\ud7af\u1100-\u11ff\u3131-\u318e"
)
_CJK = re.compile(f"[{_CJK_RANGES}]")
# Letters and digits of any script but CJK (which is one unit per character) and `_`.
_ALNUM = f"[^\\W_{_CJK_RANGES}]"
# A unit: one CJK character, or a letter/digit run whose joiners sit between two alphanumerics
# (so `GPT-4o` is one unit, while the `,` of `Stockholm,` stays a separator). A `-` between
# digits is a range or a date, not a joiner: `3000-5000` holds `3000`. A name's own `.` before
# it and `+`/`++`/`#` after it are part of it: `.NET`, `C++`, `C#` and `18+` are not `NET`,
# `C` and `18`.
_UNIT = re.compile(
    f"[{_CJK_RANGES}]"
    f"|(?:(?<!{_ALNUM})(?<!\\.)\\.(?=(?![{_CJK_RANGES}])[^\\W\\d_]))?"
    f"{_ALNUM}+(?:(?!(?<=\\d)-\\d)[-.'’/+&]{_ALNUM}+)*(?:\\+\\+?|#)?"
)
# Symbols attached to a unit that a value may keep or leave (see `_attached_prefix`); after
# a unit: `50%`, `30°`, `U.S.`, `》`.
_SUFFIX = re.compile(r"[%‰°.》〉]")
_SIGNS = "-+−"
_CURRENCIES = "$€£¥₹₩₽"
_TITLE_OPEN = "《〈"
_LATIN_WORD = re.compile(_ALNUM)


@dataclass(frozen=True)
class _Unit:
    """One unit of the fused query and what surrounds it there."""

    text: str
    #: The fused query's text from this unit to the next one ("" after the last).
    sep: str
    #: Attached symbols right before the unit / right after it (`_attached_prefix`, `_SUFFIX`).
    prefix: str
    suffix: str
    #: One CJK character (counted against `max_cjk_chars`, not `max_words`).
    cjk: bool


@dataclass(frozen=True)
class SpanLimits:
    """How long an extractive answer may be: at most `max_words` letter/digit units and at
    most `max_cjk_chars` CJK characters (a mixed span must satisfy both), and, when
    `max_share` is set, at most that share of the fused query's units (at least one unit):
    an opt-in cap against answers that hand over most of the full intent (the study's
    simulator has none)."""

    max_words: int = 16
    max_cjk_chars: int = 32
    max_share: float | None = None

    def __post_init__(self) -> None:
        if self.max_words < 1 or self.max_cjk_chars < 1:
            raise ValueError(f"span limits must be at least 1, got {self}")
        if self.max_share is not None and not 0 < self.max_share <= 1:
            raise ValueError(f"max_share must be in (0, 1], got {self.max_share}")

    def max_units(self, units: int) -> int | None:
        """The most units a span of a fused query with `units` units may hold (None: no
        cap but the word and character caps)."""
        if self.max_share is None:
            return None
        return max(1, math.floor(self.max_share * units + 1e-9))


def _attached_prefix(text: str, start: int, gap_start: int) -> str:
    """The symbol right before the unit at `start` that belongs to its value, or "": a sign
    or currency before a number (`-5°C`, `$100`), an opening title mark (`《`). A sign not
    right after a word, a number or another attached symbol: `5%-10%` and `3000-5000` hold no
    negative number."""
    if start == gap_start:  # nothing between this unit and the one before it
        return ""
    mark, before = text[start - 1], text[start - 2] if start > 1 else " "
    after_word = bool(_LATIN_WORD.fullmatch(before)) or before in "%‰°+#.-−"
    number = text[start].isdigit()
    if (
        (mark in _SIGNS and number and not after_word)
        or (mark in _CURRENCIES and number)
        or mark in _TITLE_OPEN
    ):
        return mark
    return ""


def _units(fused_query: str) -> list[_Unit]:
    """The fused query's units, each with the separator text that follows it up to the next
    unit and the symbols attached to it."""
    matches = list(_UNIT.finditer(fused_query))
    units = []
    for i, m in enumerate(matches):
        last = i + 1 == len(matches)
        # Attached symbols lie between two units, never inside one (`使用.NET` ends no span
        # with `用.`).
        after = fused_query[m.end() : len(fused_query) if last else matches[i + 1].start()]
        suffix = _SUFFIX.match(after)
        units.append(
            _Unit(
                text=m.group(),
                sep="" if last else after,
                prefix=_attached_prefix(fused_query, m.start(), matches[i - 1].end() if i else 0),
                suffix=suffix.group() if suffix else "",
                cjk=bool(_CJK.fullmatch(m.group())),
            )
        )
    return units


def _runs(fused_query: str, limits: SpanLimits) -> Iterator[list[_Unit]]:
    """Per start unit, the longest run of units from it within both caps. Every span is a
    prefix of one of these runs (with or without the attached symbols at its ends), since
    shortening a run never breaks a cap."""
    units = _units(fused_query)
    most = limits.max_units(len(units))
    for start in range(len(units)):
        words = cjk = 0
        end = start
        while end < len(units):
            if units[end].cjk:
                cjk += 1
            else:
                words += 1
            if words > limits.max_words or cjk > limits.max_cjk_chars:
                break
            if most is not None and words + cjk > most:
                break
            end += 1
        yield units[start:end]


def unit_spans(text: str) -> list[tuple[int, int]]:
    """Where the units of `text` are (start, end): what a span is made of."""
    return [m.span() for m in _UNIT.finditer(text)]


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
        nested = _escape(run[-1].text) + _optional(run[-1].suffix)
        for unit in reversed(run[:-1]):
            # Go on to the next unit, or end here with this unit's attached symbols.
            end = f"|{_escape(unit.suffix)}" if unit.suffix else ""
            nested = f"{_escape(unit.text)}(?:{_escape(unit.sep)}{nested}{end})?"
        alternatives.append(_optional(run[0].prefix) + nested)
    return "|".join([UNKNOWN, *dict.fromkeys(alternatives)])


def _optional(text: str) -> str:
    return f"(?:{_escape(text)})?" if text else ""


def spans(fused_query: str, limits: SpanLimits = SpanLimits()) -> set[str]:
    """Every span of the fused query within `limits` (what `span_regex` allows besides
    `unknown`)."""
    return set(_spans(fused_query, limits))


@functools.lru_cache(maxsize=1024)  # as span_regex: one fused query, every turn and seed
def _spans(fused_query: str, limits: SpanLimits) -> frozenset[str]:
    found: set[str] = set()
    for run in _runs(fused_query, limits):
        for text in {"", run[0].prefix}:
            for unit in run:
                text += unit.text
                found |= {text, text + unit.suffix}
                text += unit.sep
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
