"""The rules a blurred query must pass before `cts data blur` writes it (the others go to the
rejects file with their reasons). By rules, no model, except recoverability, which asks the User
Answerer, and, with `--question-check judge`, `not_a_question`, which asks the judge's model
whether the query is still a whole question (cts/eval/construct/blur.py):

- `not_the_targets`: the constraints the Blurrer says it removed, as (type, span) pairs, are not
  the ones drawn for the variant (one left out, or a type given another's span);
- `span_not_in_fused`: a removed span is not in the fused query;
- `span_still_in_blurred`: a removed span is still in the blurred query;
- `empty`, `unchanged`, `too_short`: no query, the fused query itself, under three units (words,
  or CJK characters);
- `rewritten`: under half of its units are the fused query's (blurring removes, it does not
  write another query);
- `dangling`: words left where a span was: a preposition or particle at the end ("…during?",
  "…在？"), one that now runs into what followed the span ("in for students"), a leading 的,
  space before punctuation or doubled punctuation, or part of a word the span cut ("FY" of
  "FY2025", "度" of "2025年度");
- `not_recoverable`: the User Answerer, given the fused query and a question about a removed
  constraint's type, answers with nothing of the removed span;
- `leaks`: given only the blurred query as its intent, it answers that question with a value
  (the blurred query still says it).

Spans are compared in `normal_form` (width, case and whitespace folded)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from cts.agents.fuser import StatedConstraint
from cts.agents.prompts import prompt_language
from cts.agents.types import UNKNOWN
from cts.agents.user_answerer import unit_spans
from cts.eval.data.schema import normal_form

#: Every reason a blurred row can be rejected for, with what it means (for --help and docs).
REASONS: dict[str, str] = {
    "not_the_targets": "the constraints the Blurrer says it removed are not the ones drawn",
    "span_not_in_fused": "a removed span is not in the fused query",
    "span_still_in_blurred": "a removed span is still in the blurred query",
    "empty": "the blurred query is empty",
    "unchanged": "the blurred query is the fused query",
    "too_short": "the blurred query has under three words (CJK: characters)",
    "rewritten": "under half the blurred query's words are the fused query's",
    "dangling": "words are left where a removed span was",
    "not_a_question": "the judge's model reads no whole question (--question-check judge)",
    "not_recoverable": "the User Answerer, knowing the fused query, does not give the span",
    "leaks": "the User Answerer, knowing only the blurred query, still answers",
    "model_error": "a model call failed (the row can be retried)",
}


@dataclass(frozen=True)
class Rejection:
    reason: str
    detail: str


# Words that only serve the constraint after them: left behind, they dangle.
EN_FUNCTION = frozenset(
    """in on at of for during from to by with the a an between since until before after
    about near within under over around throughout""".split()
)
_ARTICLES = frozenset({"the", "a", "an"})
_ZH_FUNCTION = "在于和与及从"
_END = "?？.。!！"


def _units(text: str) -> list[str]:
    return [text[a:b] for a, b in unit_spans(text)]


def removed_rejections(
    targets: Sequence[StatedConstraint], removed: Sequence[StatedConstraint]
) -> list[Rejection]:
    """The Blurrer says it removed exactly the drawn constraints: the same (type, span) pairs.
    What it says is checked, not trusted, as the instance records it as removed."""
    wanted = {(c.type, c.span) for c in targets}
    said = {(c.type, c.span) for c in removed}
    if said == wanted:
        return []
    missing = ", ".join(f"{t} {s!r}" for t, s in sorted(wanted - said)) or "none"
    extra = ", ".join(f"{t} {s!r}" for t, s in sorted(said - wanted)) or "none"
    return [Rejection("not_the_targets", f"not said removed: {missing}; not drawn: {extra}")]


def span_rejections(
    fused_query: str, blurred_query: str, removed: Sequence[StatedConstraint]
) -> list[Rejection]:
    """Each removed span is in the fused query and gone from the blurred one."""
    fused, blurred = normal_form(fused_query), normal_form(blurred_query)
    found = []
    for c in removed:
        span = normal_form(c.span)
        if span not in fused:
            found.append(Rejection("span_not_in_fused", f"{c.type} span {c.span!r}"))
        elif span in blurred:
            found.append(Rejection("span_still_in_blurred", f"{c.type} span {c.span!r}"))
    return found


def question_rejections(
    fused_query: str, blurred_query: str, removed: Sequence[StatedConstraint]
) -> list[Rejection]:
    """Whether the blurred query is still a question a user could ask: not empty, not the
    fused query, three units or more, nothing dangling where a span was."""
    text = " ".join(blurred_query.split())
    if not text:
        return [Rejection("empty", "no blurred query")]
    if normal_form(text) == normal_form(fused_query):
        return [Rejection("unchanged", text)]
    found = []
    units = _units(normal_form(text))
    if len(units) < 3:
        found.append(Rejection("too_short", text))
    kept = set(_units(normal_form(fused_query)))
    if units and sum(u in kept for u in units) < len(units) / 2:
        found.append(Rejection("rewritten", text))
    found += [Rejection("dangling", why) for why in _dangling(fused_query, text, removed)]
    return found


def _dangling(fused_query: str, blurred: str, removed: Sequence[StatedConstraint]) -> list[str]:
    found = []
    body = blurred.rstrip(_END).rstrip()
    last = body.split()[-1].lower() if body.split() else ""
    if last in EN_FUNCTION:
        found.append(f"ends with {last!r}")
    if body and body[-1] in _ZH_FUNCTION:
        found.append(f"ends with {body[-1]!r}")
    if blurred.startswith("的"):
        found.append("starts with '的'")
    if re.search(r"\s[,，.。?？!！;；:：]", blurred):
        found.append("a space before punctuation")
    if re.search(r"([,，.。?？!！;；、])\s*\1", blurred):
        found.append("doubled punctuation")
    found += [f"{joined!r} where a span was" for joined in _run_ons(fused_query, blurred, removed)]
    found += _cut_words(fused_query, removed)
    return found


#: Two-character CJK words whose first character can end a time span (`2025年`) while the
#: second is left alone by its removal: `2025年度` without `2025年` leaves `度`. CJK text has no
#: spaces and its units are single characters, so a cut word is only seen through words known
#: to be one (a segmenter splits invented names wrongly: `溪川市2025年公租房` into `年公`).
_CJK_BOUND = frozenset(
    "年度 年版 年级 年代 年初 年底 年末 年中 年间 年份 月份 月初 月底 月末 月中 日前 日后".split()
)


def _cut_words(fused_query: str, removed: Sequence[StatedConstraint]) -> list[str]:
    """A removed span that starts or ends inside a unit of the fused query (`2025` of
    `FY2025`, `Caldmoor` of `Caldmoor's`), or cuts a known CJK word (`2025年` of `2025年度`):
    its removal leaves part of a word behind. Each time the span occurs is checked."""
    units = unit_spans(fused_query)
    found = []
    for c in removed:
        for at in _occurrences(fused_query, c.span):
            end = at + len(c.span)
            inside = [(a, b) for a, b in units if a < at < b or a < end < b]
            cut = [fused_query[a:b] for a, b in inside]
            cut += [w for w in [fused_query[end - 1 : end + 1]] if w in _CJK_BOUND]
            found += [f"{c.span!r} cuts {word!r}" for word in cut]
    return list(dict.fromkeys(found))


def _occurrences(text: str, span: str) -> list[int]:
    found, at = [], text.find(span)
    while at >= 0:
        found.append(at)
        at = text.find(span, at + 1)
    return found


def _run_ons(fused_query: str, blurred: str, removed: Sequence[StatedConstraint]) -> list[str]:
    """A function word that stood before a removed span, now run into the word that followed
    the span ("in for" from "in 2024 for"), where the fused query never has them together."""
    found = []
    for c in removed:
        at = fused_query.find(c.span)
        if at < 0:
            continue
        before = fused_query[:at].split()
        after = fused_query[at + len(c.span) :].split()
        # An article before a removed modifier still fits ("the night trains" → "the trains").
        if not before or not after or before[-1].lower() not in EN_FUNCTION - _ARTICLES:
            continue
        joined = f"{before[-1]} {after[0]}"
        if joined.lower() in blurred.lower() and joined.lower() not in fused_query.lower():
            found.append(joined)
    return found


# -- recoverability ------------------------------------------------------------------------------

#: The question the User Answerer is asked about a removed constraint of each type.
RECOVERY_QUESTIONS: dict[str, dict[str, str]] = {
    "time": {"en": "Which time or date do you mean?", "zh": "你指的是什么时间？"},
    "region": {"en": "Which place or region do you mean?", "zh": "你指的是哪个地方？"},
    "scope": {"en": "Which part or kind exactly do you mean?", "zh": "你具体指哪一部分或哪一类？"},
    "entity": {"en": "Which one exactly do you mean?", "zh": "你具体指哪一个？"},
    "numeric": {"en": "Which number or amount do you mean?", "zh": "你指的是多少？"},
    "definition": {"en": "What exactly do you mean by that?", "zh": "你具体是什么意思？"},
    "other": {
        "en": "Could you say more precisely what you want?",
        "zh": "能更具体地说说你要什么吗？",
    },
}


def recovery_question(constraint_type: str, language: str) -> str:
    return RECOVERY_QUESTIONS[constraint_type][prompt_language(language)]


def overlaps(answer: str, span: str) -> bool:
    """Whether an answer shares a unit (a word, a CJK character) with the span, in
    `normal_form`."""
    if answer == UNKNOWN:
        return False
    return bool(set(_units(normal_form(answer))) & set(_units(normal_form(span))))


@dataclass(frozen=True)
class Recovery:
    """The User Answerer's two answers to one removed constraint's question."""

    type: str
    span: str
    question: str
    #: Knowing the fused query: should overlap the span.
    from_fused: str
    #: Knowing only the blurred query: should be `unknown`.
    from_blurred: str


def recovery_rejections(recoveries: Sequence[Recovery]) -> list[Rejection]:
    found = []
    for r in recoveries:
        if not overlaps(r.from_fused, r.span):
            found.append(
                Rejection("not_recoverable", f"{r.type}: {r.question!r} → {r.from_fused!r}")
            )
        if r.from_blurred != UNKNOWN:
            found.append(Rejection("leaks", f"{r.type}: {r.question!r} → {r.from_blurred!r}"))
    return found
