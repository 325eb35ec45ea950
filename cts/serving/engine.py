"""The engine interface: one async `chat` call, whatever runs the model.

Every engine validates constrained answers here, in the base class, so no engine can hand back
an unvalidated value; violations are counted and raised, never returned.
"""

from __future__ import annotations

import abc
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from cts.serving.errors import ConstrainedOutputError, EngineError
from cts.serving.outputs import valid_unicode, validate_output
from cts.serving.replicas import Replicas
from cts.serving.types import ChatRequest, ChatResponse, PromptCount


@dataclass
class EngineStats:
    calls: int = 0
    #: Calls with an output constraint (JSON schema, choice or regex).
    constrained: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    #: Attempts that failed and were sent again, by why (`timeout`, `connection`, `HTTP 503`).
    #: A timed-out attempt's work on the server is lost: many mean a busy server, not a dead one.
    retried: Counter[str] = field(default_factory=Counter)
    #: A model served by replicas: requests each was sent, which were found down.
    replicas: Replicas | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            **vars(self),
            "errors": dict(self.errors),
            "retried": dict(self.retried),
            "replicas": self.replicas.as_dict() if self.replicas else None,
        }


class ChatModel(Protocol):
    """What callers (roles, the search agent) hold: an engine, possibly behind the cache."""

    identity: str
    model: str

    @property
    def stats(self) -> EngineStats: ...

    async def chat(self, request: ChatRequest) -> ChatResponse: ...

    async def count_prompt_tokens(self, request: ChatRequest) -> PromptCount | None: ...

    async def aclose(self) -> None: ...


class Wrapped:
    """A `ChatModel` around another (`inner`): its identity, model and stats, with prompt
    counts, calls and closing passed through; a subclass changes what it does around them."""

    def __init__(self, inner: ChatModel) -> None:
        self.inner = inner
        self.identity = inner.identity
        self.model = inner.model

    @property
    def stats(self) -> EngineStats:
        return self.inner.stats

    async def chat(self, request: ChatRequest) -> ChatResponse:
        return await self.inner.chat(request)

    async def count_prompt_tokens(self, request: ChatRequest) -> PromptCount | None:
        return await self.inner.count_prompt_tokens(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class Engine(abc.ABC):
    """Base of every engine. Subclasses implement `_complete`; callers use `chat`."""

    #: Names the engine kind, the model and the weights: part of every cache key.
    identity: str
    #: The model name as requests carry it (vLLM's served name).
    model: str

    def __init__(self) -> None:
        self.stats = EngineStats()

    async def chat(self, request: ChatRequest) -> ChatResponse:
        self.stats.calls += 1
        self.stats.constrained += request.output is not None
        try:
            response = await self._complete(request)
            # Where model text enters: a lone surrogate (a server's JSON escape) would make
            # every later write of it fail — the record, the trace, the cache row.
            response.text = valid_unicode(response.text)
            if request.output is not None:
                response.parsed = validate_output(request.output, response.text)
        except EngineError as e:
            self.stats.errors[e.kind] += 1
            raise
        self.stats.prompt_tokens += response.usage.prompt_tokens
        self.stats.completion_tokens += response.usage.completion_tokens
        return response

    @abc.abstractmethod
    async def _complete(self, request: ChatRequest) -> ChatResponse:
        """Run the model; return the raw answer (validation happens in `chat`)."""

    async def count_prompt_tokens(self, request: ChatRequest) -> PromptCount | None:
        """The request's prompt tokens exactly as the model will see them, and its context
        window when known; None when this engine cannot count (callers then estimate)."""
        return None

    async def aclose(self) -> None:  # noqa: B027 - engines without resources need nothing
        """Release servers, threads and clients."""


__all__ = [
    "ChatModel",
    "ConstrainedOutputError",
    "Engine",
    "EngineError",
    "EngineStats",
    "Wrapped",
]
