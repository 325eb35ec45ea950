"""The Blurrer (building a benchmark, `cts data blur`): from a fused query and the constraints
chosen for removal, writes the vague query a user might have typed instead, the
`blurred_query`, and says which constraints it removed. Its schema asks for every chosen
constraint, each as its whole (type, span) pair, so a removed span is always one the fused query
states under its own type; whether the list is the chosen one, whether each span is really gone
from the blurred query, and whether a user could still ask it, is checked afterwards
(cts/eval/construct/blur.py, cts/eval/construct/checks.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from cts.agents.fuser import FUSED_MAX_CHARS, StatedConstraint
from cts.agents.prompts import render
from cts.serving.engine import ChatModel
from cts.serving.types import ChatRequest, ChoiceOutput, JsonSchemaOutput, RoleSampling, Sampling


class Blurred(BaseModel):
    blurred_query: str
    removed: list[StatedConstraint]


def blurred_schema(targets: Sequence[StatedConstraint]) -> dict[str, Any]:
    """The blurred query and the removed constraints: every one of `targets`, each a whole
    (type, span) pair of them. Pairs, not a type enum beside a span enum, so that a type cannot
    be reported with another target's span; as many items as targets, so that none is left out
    (a duplicate item, which the schema cannot rule out everywhere, is caught by the blur's
    check of the removed set against the targets)."""
    pairs = list(dict.fromkeys((t.type, t.span) for t in targets))
    return {
        "type": "object",
        "properties": {
            "blurred_query": {"type": "string", "minLength": 5, "maxLength": FUSED_MAX_CHARS},
            "removed": {
                "type": "array",
                "minItems": len(pairs),
                "maxItems": len(pairs),
                "items": {"anyOf": [_pair_schema(kind, span) for kind, span in pairs]},
            },
        },
        "required": ["blurred_query", "removed"],
        "additionalProperties": False,
    }


def _pair_schema(kind: str, span: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"type": {"const": kind}, "span": {"const": span}},
        "required": ["type", "span"],
        "additionalProperties": False,
    }


#: Room for the longest valid answer as JSON.
SAMPLING = RoleSampling(max_tokens=64 + FUSED_MAX_CHARS + 3 * 120)


def constraint_list(targets: Sequence[StatedConstraint]) -> str:
    return "\n".join(f"- {t.type}: {t.span}" for t in targets)


async def blur(
    engine: ChatModel,
    fused_query: str,
    targets: Sequence[StatedConstraint],
    language: str,
    sampling: Sampling,
) -> Blurred:
    """`fused_query` with `targets` removed, as the model wrote it (whitespace normalised),
    and the constraints it says it removed (each one of `targets`, duplicates dropped)."""
    if not targets:
        raise ValueError("blurring needs at least one constraint to remove")
    system, user = render(
        "blurrer", language, fused_query=fused_query, constraints=constraint_list(targets)
    )
    response = await engine.chat(
        ChatRequest(
            messages=(system, user),
            sampling=sampling,
            output=JsonSchemaOutput(name="blurred_query", json_schema=blurred_schema(targets)),
        )
    )
    found = Blurred.model_validate(response.parsed)
    removed = {(c.type, c.span): c for c in found.removed}
    return Blurred(blurred_query=" ".join(found.blurred_query.split()), removed=[*removed.values()])


#: A yes or no (the judge's check of a blurred query, `cts data blur --question-check judge`).
QUESTION_SAMPLING = RoleSampling(max_tokens=4, temperature=0.0)


async def is_question(
    engine: ChatModel, blurred_query: str, language: str, sampling: Sampling
) -> bool:
    """Whether the judge's model reads `blurred_query` as a whole question a user could type
    into a search box (not a fragment, not broken by a removal)."""
    system, user = render("question_check", language, blurred_query=blurred_query)
    response = await engine.chat(
        ChatRequest(
            messages=(system, user), sampling=sampling, output=ChoiceOutput(choices=("yes", "no"))
        )
    )
    return response.text.strip() == "yes"
