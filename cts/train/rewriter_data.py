"""Rewriter calls for fine-tuning the tiny Rewriter, from the train split only.

The tiny model, asked to rewrite, returns the blurred query as it was: an answer the user gave
("in its spring") never reaches the search, so clarify@k is blurred by another name. This
module writes what a careful rewriter does with a dialogue: every answer that is not `unknown`
added to the query, nothing else (an `unknown` leaves that detail open, as the role's prompt
says). The rewritten query is the blurred query with the answers appended in the order given
(`with_answers`: "Which smartphones did Nyvra launch, and what were their starting prices,
2023?"), the form the searcher adapter was trained to search with (cts/train/searcher_data.py).

Each example is one Rewriter call as a dialogue makes it (cts/agents/rewriter.py): the blurred
query and 1-3 question/answer pairs rendered in the role's own prompt
(cts/agents/prompts/rewriter.yaml), and as completion the JSON its schema admits. The pairs are
User Answerer calls drawn as `cts.train.answerer_data` draws them (a question about a removed
constraint answered with its span, or about what the fused query does not say answered
`unknown`), and some questions that only repeat the blurred query, as the tiny Clarifier asks
them, answered `unknown` or with a removed span. The instances are the sample benchmark's
`train.jsonl`; dev and test are never read. Everything is drawn from one
`random.Random(seed)`: the same seed gives the same examples, in the same order.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from cts.agents.prompts import render
from cts.agents.rewriter import RewrittenQuery
from cts.agents.types import QA, UNKNOWN, history_text
from cts.train.answerer_data import Instance, answerer_example, read_instances
from cts.train.sft import RoleCall, as_json, chat, in_turn

#: Share of questions that repeat the blurred query (the tiny Clarifier's habit).
ECHO_SHARE = 0.25
#: Share of those answered with a removed span (the rest: `unknown`).
ECHO_VALUE_SHARE = 0.3


@dataclass(frozen=True)
class RewriterExample(RoleCall):
    """One Rewriter call: its chat messages (system, user) and the completion (JSON)."""

    #: How many of the dialogue's answers are values (not `unknown`).
    values: int

    @property
    def label(self) -> str:
        return "values" if self.values else "unknown"


def with_answers(blurred_query: str, values: Sequence[str], language: str) -> str:
    """The blurred query with each answer it does not already hold appended, in order."""
    new = [v for v in dict.fromkeys(values) if v not in blurred_query]
    if not new:
        return blurred_query
    stem = blurred_query.rstrip("?？ ")
    if language == "zh":
        return f"{stem}（{'，'.join(new)}）？"
    return f"{stem}, {', '.join(new)}?"


def _pair(instance: Instance, rng: random.Random) -> QA:
    """One question and the User Answerer's answer to it."""
    if rng.random() < ECHO_SHARE:
        answer = UNKNOWN
        if instance.constraints and rng.random() < ECHO_VALUE_SHARE:
            answer = rng.choice(instance.constraints).span
        return QA(question=instance.blurred_query, answer=answer)
    drawn = answerer_example(instance, rng)
    return QA(question=drawn.question, answer=drawn.completion)


def rewriter_example(instance: Instance, rng: random.Random) -> RewriterExample:
    pairs = [_pair(instance, rng) for _ in range(rng.randint(1, 3))]
    values = [p.answer for p in pairs if p.answer != UNKNOWN]
    query = with_answers(instance.blurred_query, values, instance.language)
    system, user = render(
        "rewriter",
        instance.language,
        blurred_query=instance.blurred_query,
        history=history_text(pairs, instance.language),
    )
    completion = as_json({"query": query})
    return RewriterExample(
        instance_id=instance.id,
        language=instance.language,
        values=len(values),
        messages=chat(system, user),
        completion=completion,
    )


def generate(count: int, seed: int) -> list[RewriterExample]:
    """`count` Rewriter calls drawn with `seed` from the train split's instances in turn."""
    return in_turn(read_instances(), count, seed, rewriter_example)


def label_counts(examples: Sequence[RewriterExample]) -> dict[str, int]:
    """Examples whose dialogue gave a value, and those where every answer was `unknown`."""
    return dict(sorted(Counter(e.label for e in examples).items()))


def check_completion(example: RewriterExample) -> None:
    """Raise if the completion is not what the role's schema admits."""
    RewrittenQuery.model_validate_json(example.completion)
