"""The Clarifier: sees the blurred query and earlier Q&A only, asks one question per turn."""

from __future__ import annotations

from pydantic import BaseModel, Field

from agents.prompts import render
from agents.types import QA, history_text
from serving.engine import ChatModel
from serving.types import ChatRequest, JsonSchemaOutput, Sampling


class ClarifyingQuestion(BaseModel):
    question: str = Field(min_length=3, max_length=200)


class ClarifyingQuestionOrStop(ClarifyingQuestion):
    """With early stopping allowed: `stop: true` means the query needs no (further) question."""

    stop: bool


async def ask(
    engine: ChatModel,
    blurred_query: str,
    history: list[QA],
    language: str,
    sampling: Sampling,
    allow_stop: bool = False,
) -> ClarifyingQuestionOrStop:
    schema = ClarifyingQuestionOrStop if allow_stop else ClarifyingQuestion
    system, user = render(
        "clarifier", language, blurred_query=blurred_query, history=history_text(history, language)
    )
    response = await engine.chat(
        ChatRequest(messages=(system, user), sampling=sampling, output=JsonSchemaOutput.of(schema))
    )
    parsed = schema.model_validate(response.parsed)
    return ClarifyingQuestionOrStop(question=parsed.question, stop=getattr(parsed, "stop", False))
