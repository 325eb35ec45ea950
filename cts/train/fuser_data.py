"""Fuser calls for fine-tuning the tiny Fuser, from the train split only.

The tiny model, asked to fuse a session, writes a question the queries do not add up to, and
its constraint spans are mostly not in it (`cts data fuse` drops such spans, and blurring then
has nothing to remove). A 135M model cannot compose an intent from fragments; what it can learn
is what this module writes, a careful *copying* fuser: the session's most complete query (the
one with the most words; the last of those on a tie) as the question, its first letter a
capital and a question mark at its end, and as constraints the spans it states that rules find
(`stated_spans`: a time, a figure with its unit) plus the train instance's removed constraint
where its span is in that query. A paper's build uses a real model for this role
(cts/configs/experiments/build.yaml).

The sessions are made from the train split's fused queries (`train.jsonl`; dev, test and the
shipped raw queries are never read): two or three queries, each the fused query's content words
or some of them (`keywords`), sometimes lowercased, sometimes the fused question itself, the
most complete one anywhere in the session. Everything is drawn from one `random.Random(seed)`:
the same seed gives the same examples, in the same order.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from cts.agents.fuser import FusedIntent, StatedConstraint, raw_list
from cts.agents.prompts import render
from cts.agents.user_answerer import unit_spans
from cts.train.answerer_data import Instance, read_instances
from cts.train.sft import RoleCall, as_json, chat, in_turn

#: Share of sessions that hold the fused question itself (the rest: keyword queries only).
QUESTION_SHARE = 0.3
#: Share of keyword queries typed in lower case.
LOWER_SHARE = 0.5

#: Words a keyword query leaves out (a question's frame, not its content).
_FRAME = frozenset(
    """what which who whom whose when where why how is are was were do does did will would
    can could should the a an and or of in on at to for by with from during as that this
    these those there their its it be been has have had""".split()
)
_ZH_FRAME = re.compile(r"是什么|有哪些|哪些|什么|怎么样|如何|多少|吗|呢|的|？|，|、|“|”")
_END = "?？.。!！ "

#: A time a query states: a year, a month or season or holiday with the year after it, or a
#: Chinese date (2025年, 3月, 2025年3月).
_TIME = re.compile(
    r"(?:(?:January|February|March|April|May|June|July|August|September|October|November|"
    r"December|spring|summer|autumn|winter|Easter|Christmas)\s+)?(?:19|20)\d\d\b|"
    r"(?:19|20)\d\d年(?:\d{1,2}月)?|\d{1,2}月",
    re.I,
)
#: A figure with its unit (23 kg, 23kg, 2000元, 65 percent), not a year.
_FIGURE = re.compile(
    r"(?<![\d.])\d+(?:[.,]\d+)?\s?(?:kg|g|km|m|cm|mm|ml|l|%|percent|hours?|minutes?|days?|"
    r"years?|euros?|dollars?|GB|TB|元|万|公斤|千克|克|千瓦|米|公里|小时|分钟|天|岁|平方米)(?![A-Za-z])"
)


def stated_spans(query: str) -> list[StatedConstraint]:
    """The times and figures `query` states, by rule, in order, none overlapping."""
    found: list[tuple[int, StatedConstraint]] = []
    taken: list[tuple[int, int]] = []
    for kind, pattern in (("time", _TIME), ("numeric", _FIGURE)):
        for m in pattern.finditer(query):
            if any(m.start() < e and s < m.end() for s, e in taken):
                continue
            taken.append(m.span())
            found.append((m.start(), StatedConstraint(type=kind, span=m.group().strip())))
    return [c for _, c in sorted(found, key=lambda f: f[0])]


def keywords(query: str, language: str) -> list[str]:
    """The content words of a question (Chinese: its pieces between frame words)."""
    if language == "zh":
        return [p for p in _ZH_FRAME.split(query) if p.strip()]
    words = [query[s:e] for s, e in unit_spans(query)]
    return [w for w in words if w.lower() not in _FRAME]


def tidy(query: str, language: str) -> str:
    """A query as the question it is: a capital first letter, a question mark at its end."""
    text = " ".join(query.split()).rstrip(_END)
    return text[:1].upper() + text[1:] + ("？" if language == "zh" else "?")


def most_complete(session: Sequence[str]) -> str:
    """The query with the most units (words, CJK characters); the last of those on a tie."""
    best = max(len(unit_spans(q)) for q in session)
    return [q for q in session if len(unit_spans(q)) == best][-1]


@dataclass(frozen=True)
class FuserExample(RoleCall):
    """One Fuser call: its chat messages (system, user) and the completion (JSON)."""

    session: list[str]
    constraints: list[StatedConstraint]

    @property
    def label(self) -> str:
        """Whether the session's most complete query is a whole question or keywords."""
        return "question" if most_complete(self.session)[-1:] in "?？" else "keywords"


def _keyword_query(words: list[str], keep: float, rng: random.Random, language: str) -> str:
    kept = [w for w in words if rng.random() < keep] or words[:1]
    # A Chinese query runs its pieces together or spaces them, as users type both.
    text = "".join(kept) if language == "zh" and rng.random() < 0.5 else " ".join(kept)
    return text.lower() if rng.random() < LOWER_SHARE else text


def session(instance: Instance, rng: random.Random) -> list[str]:
    """Two or three queries about the instance's fused query, the most complete one (all its
    content words, or the question itself) at a random place."""
    words = keywords(instance.fused_query, instance.language)
    full = (
        instance.fused_query
        if rng.random() < QUESTION_SHARE
        else _keyword_query(words, 1.0, rng, instance.language)
    )
    partial = [_keyword_query(words, 0.5, rng, instance.language) for _ in range(rng.randint(1, 2))]
    partial = [q for q in partial if len(unit_spans(q)) < len(unit_spans(full))] or [words[0]]
    queries = [*partial]
    queries.insert(rng.randint(0, len(queries)), full)
    return queries


def intent_of(queries: Sequence[str], instance: Instance) -> tuple[str, list[StatedConstraint]]:
    """What a careful copying fuser writes: the most complete query tidied, and its stated
    spans (the instance's removed constraint where its span is in it, then the rules')."""
    query = tidy(most_complete(queries), instance.language)
    known = [
        StatedConstraint(type=c.type, span=c.span) for c in instance.constraints if c.span in query
    ]
    ruled = [c for c in stated_spans(query) if not any(c.span in k.span for k in known)]
    return query, [*known, *ruled]


def fuser_example(instance: Instance, rng: random.Random) -> FuserExample:
    queries = session(instance, rng)
    query, constraints = intent_of(queries, instance)
    system, user = render("fuser", instance.language, queries=raw_list(queries))
    return FuserExample(
        instance_id=instance.id,
        language=instance.language,
        session=queries,
        constraints=constraints,
        completion=as_json(FusedIntent(query=query, constraints=constraints)),
        messages=chat(system, user),
    )


def generate(count: int, seed: int) -> list[FuserExample]:
    """`count` Fuser calls drawn with `seed` from the train split's instances in turn."""
    return in_turn(read_instances(), count, seed, fuser_example)


def label_counts(examples: Sequence[FuserExample]) -> dict[str, int]:
    """Sessions whose most complete query is the question itself, and keyword sessions."""
    return dict(sorted(Counter(e.label for e in examples).items()))


def constraint_counts(examples: Sequence[FuserExample]) -> dict[str, int]:
    """How many stated constraints of each type the completions list."""
    return dict(sorted(Counter(c.type for e in examples for c in e.constraints).items()))


def check_completion(example: FuserExample) -> None:
    """Raise if the completion is not what the role's schema admits, or a span is not in its
    query."""
    intent = FusedIntent.model_validate_json(example.completion)
    for c in intent.constraints:
        if c.span not in intent.query:
            raise ValueError(f"{example.instance_id}: {c.span!r} is not in {intent.query!r}")
