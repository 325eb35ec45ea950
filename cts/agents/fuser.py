"""The Fuser (building a benchmark, `cts data fuse`): reads one search session's raw queries (a
user's fragments and reformulations) and writes the one clear intent they add up to, the
`fused_query`, with the constraints it states: each a type and its span, verbatim in the query,
so that blurring can later remove exactly that text (cts/agents/blurrer.py)."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from cts.agents.prompts import render
from cts.agents.question_type import QuestionType
from cts.serving.engine import ChatModel
from cts.serving.types import ChatRequest, JsonSchemaOutput, RoleSampling, Sampling

#: Most constraints one intent states (the study's instances lose one to three).
MAX_CONSTRAINTS = 6
FUSED_MAX_CHARS = 300
SPAN_MAX_CHARS = 80


class StatedConstraint(BaseModel):
    """A constraint the fused query states: its type and its text in the query."""

    type: QuestionType
    span: str = Field(min_length=1, max_length=SPAN_MAX_CHARS)


class FusedIntent(BaseModel):
    query: str = Field(min_length=5, max_length=FUSED_MAX_CHARS)
    constraints: list[StatedConstraint] = Field(default_factory=list, max_length=MAX_CONSTRAINTS)


#: Room for the longest valid answer as JSON (a small model may spend a token a character).
SAMPLING = RoleSampling(max_tokens=64 + FUSED_MAX_CHARS + MAX_CONSTRAINTS * (SPAN_MAX_CHARS + 24))


def raw_list(raw_queries: Sequence[str]) -> str:
    return "\n".join(f"- {q}" for q in raw_queries)


async def fuse(
    engine: ChatModel, raw_queries: Sequence[str], language: str, sampling: Sampling
) -> FusedIntent:
    """The intent of one session's raw queries, whitespace normalised. Constraint spans are
    returned as the model gave them: whether each is in the query is the caller's check."""
    system, user = render("fuser", language, queries=raw_list(raw_queries))
    response = await engine.chat(
        ChatRequest(
            messages=(system, user), sampling=sampling, output=JsonSchemaOutput.of(FusedIntent)
        )
    )
    intent = FusedIntent.model_validate(response.parsed)
    return FusedIntent(
        query=" ".join(intent.query.split()),
        constraints=[
            StatedConstraint(type=c.type, span=" ".join(c.span.split())) for c in intent.constraints
        ],
    )
