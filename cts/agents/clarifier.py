"""The Clarifier: sees the blurred query and earlier Q&A only. By default it asks one question
per turn (`ask`, sequential multi-turn); `ask_all` is the all-at-once option: k questions in
one call, before any answer."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from cts.agents.prompts import render
from cts.agents.types import QA, history_text
from cts.serving.engine import ChatModel
from cts.serving.types import ChatRequest, JsonSchemaOutput, Message, RoleSampling, Sampling

QUESTION_MAX_CHARS = 200


class ClarifyingQuestion(BaseModel):
    question: str = Field(min_length=3, max_length=QUESTION_MAX_CHARS)


class ClarifyingQuestionOrStop(ClarifyingQuestion):
    """With early stopping allowed: `stop: true` means the query needs no (further) question."""

    stop: bool


#: Room for one question as JSON; `ask_all` scales it by k.
SAMPLING = RoleSampling(max_tokens=96)


def messages(blurred_query: str, history: list[QA], language: str) -> tuple[Message, Message]:
    """The system and user messages `ask` sends. Fine-tuning (cts/train/pairs.py) builds its
    prompts here too, so a trained clarifier sees exactly the text it is asked with."""
    return render(
        "clarifier", language, blurred_query=blurred_query, history=history_text(history, language)
    )


def output(allow_stop: bool = False) -> JsonSchemaOutput:
    """The constraint `ask` puts on its answer (GRPO's rollouts sample under it too)."""
    return JsonSchemaOutput.of(ClarifyingQuestionOrStop if allow_stop else ClarifyingQuestion)


async def ask(
    engine: ChatModel,
    blurred_query: str,
    history: list[QA],
    language: str,
    sampling: Sampling,
    allow_stop: bool = False,
) -> ClarifyingQuestionOrStop:
    schema = ClarifyingQuestionOrStop if allow_stop else ClarifyingQuestion
    response = await engine.chat(
        ChatRequest(
            messages=messages(blurred_query, history, language),
            sampling=sampling,
            output=output(allow_stop),
        )
    )
    parsed = schema.model_validate(response.parsed)
    return ClarifyingQuestionOrStop(question=parsed.question, stop=getattr(parsed, "stop", False))


def questions_schema(k: int, allow_stop: bool) -> dict[str, Any]:
    """Exactly k questions, or with early stopping allowed between 0 and k."""
    return {
        "type": "object",
        "properties": {
            "questions": {
                "type": "array",
                "items": {"type": "string", "minLength": 3, "maxLength": QUESTION_MAX_CHARS},
                "minItems": 0 if allow_stop else k,
                "maxItems": k,
            }
        },
        "required": ["questions"],
        "additionalProperties": False,
    }


async def ask_all(
    engine: ChatModel,
    blurred_query: str,
    k: int,
    language: str,
    sampling: Sampling,
    allow_stop: bool = False,
) -> list[str]:
    """k questions at once."""
    system, user = render("clarifier_all_at_once", language, blurred_query=blurred_query, k=k)
    response = await engine.chat(
        ChatRequest(
            messages=(system, user),
            # `sampling.max_tokens` is the room for one question (SAMPLING), and k is this
            # call's: the role's declaration cannot scale it.
            sampling=sampling.model_copy(update={"max_tokens": sampling.max_tokens * k}),
            output=JsonSchemaOutput(
                name="clarifying_questions", json_schema=questions_schema(k, allow_stop)
            ),
        )
    )
    return list(response.parsed["questions"])
