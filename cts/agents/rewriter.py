"""The Rewriter: sees the blurred query and the Q&A pairs (never the fused query) and writes the
query the search agent gets; an `unknown` answer leaves that ambiguity open."""

from __future__ import annotations

from pydantic import BaseModel, Field

from cts.agents.prompts import render
from cts.agents.types import QA, history_text
from cts.serving.engine import ChatModel
from cts.serving.types import ChatRequest, JsonSchemaOutput, RoleSampling, Sampling


class RewrittenQuery(BaseModel):
    query: str = Field(min_length=3, max_length=200)


#: Room for the longest rewritten query as JSON.
SAMPLING = RoleSampling(max_tokens=192)


async def rewrite(
    engine: ChatModel, blurred_query: str, pairs: list[QA], language: str, sampling: Sampling
) -> str:
    system, user = render(
        "rewriter", language, blurred_query=blurred_query, history=history_text(pairs, language)
    )
    response = await engine.chat(
        ChatRequest(
            messages=(system, user), sampling=sampling, output=JsonSchemaOutput.of(RewrittenQuery)
        )
    )
    return RewrittenQuery.model_validate(response.parsed).query
