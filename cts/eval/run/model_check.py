"""Send one real request through the engine of each model an experiment's roles use, and time it.

What `cts models check --role` prints: proof that the configured model loads, answers, and
honours a constrained output.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import Role
from cts.eval.run.engines import open_engines
from cts.serving.errors import EngineError
from cts.serving.types import ChatRequest, JsonSchemaOutput, Message

DEFAULT_PROMPT = (
    "A user typed the vague search query 'best phone'. "
    "Ask one short question that would tell you what they really want."
)


class ClarifyingQuestion(BaseModel):
    """The structured answer of the check request."""

    question: str = Field(min_length=1, max_length=300)


@dataclass
class ModelCheck:
    model: str
    engine: str
    roles: list[str]
    text: str
    parsed: Any
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    cached: bool
    error: str | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0


async def check_models(
    resolved: ResolvedExperiment,
    roles: list[Role],
    prompt: str = DEFAULT_PROMPT,
    structured: bool = True,
    use_cache: bool = True,
) -> list[ModelCheck]:
    """One request per distinct model of `roles`."""
    roles_of: dict[str, list[Role]] = {}
    for role in roles:
        roles_of.setdefault(resolved.experiment.roles[role].model, []).append(role)
    output = JsonSchemaOutput.of(ClarifyingQuestion) if structured else None

    async with open_engines(resolved, roles, use_cache=use_cache) as engines:

        async def one(ref: str, its_roles: list[Role]) -> ModelCheck:
            config = resolved.model_configs[ref]
            request = ChatRequest(
                messages=(Message(role="user", content=prompt),),
                # The check's own request, not one of the role's: the role's needs do not apply.
                sampling=resolved.configured_sampling(its_roles[0], max_tokens=64),
                output=output,
            )
            check = ModelCheck(
                config.name, config.engine, list(its_roles), "", None, 0, 0, 0.0, False
            )
            if config.engine == "lexical":  # nothing to ask: it answers no chat request
                check.text = "(the lexical judge: no model, it labels nuggets only)"
                return check
            started = time.perf_counter()
            try:
                r = await engines.by_model[ref].chat(request)
            except EngineError as e:
                check.error = f"{e.kind}: {e}"
            else:
                check.text, check.parsed, check.cached = r.text, r.parsed, r.cached
                check.prompt_tokens = r.usage.prompt_tokens
                check.completion_tokens = r.usage.completion_tokens
            check.seconds = time.perf_counter() - started
            return check

        checks = await asyncio.gather(*(one(ref, rs) for ref, rs in roles_of.items()))
        return list(checks)
