"""A scripted engine for logic and fault-injection tests (never for model behaviour)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from serving.engine import Engine
from serving.errors import EngineError
from serving.types import ChatRequest, ChatResponse, Usage

Script = Callable[[ChatRequest], str | Exception]


class ScriptedEngine(Engine):
    """Answers each request with `script(request)`; an Exception result is raised instead."""

    def __init__(self, script: Script, name: str = "scripted", delay_s: float = 0.0) -> None:
        super().__init__()
        self.model = name
        self.identity = f"scripted:{name}"
        self.script = script
        self.delay_s = delay_s
        self.requests: list[ChatRequest] = []

    async def _complete(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        result = self.script(request)
        if isinstance(result, EngineError):
            raise result
        if isinstance(result, Exception):
            raise EngineError(str(result))
        # Plausible token counts (about 4 characters a token) for budget logic.
        prompt = sum(len(m.content) for m in request.messages) // 4 + 1
        return ChatResponse(
            text=result, usage=Usage(prompt_tokens=prompt, completion_tokens=len(result) // 4 + 1)
        )
