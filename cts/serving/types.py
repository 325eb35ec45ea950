"""The one request/response shape every model call goes through, whatever runs the model."""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Message(_Frozen):
    role: Literal["system", "user", "assistant"]
    content: str


class Sampling(_Frozen):
    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(256, gt=0)
    seed: int | None = 0
    stop: tuple[str, ...] = ()
    repetition_penalty: float = Field(1.0, gt=0.0)
    #: Top-k (-1: off), sent only when set: unset, a vLLM server applies the checkpoint's
    #: generation config (WebDancer's says 40).
    top_k: int | None = Field(None, ge=-1)

    @model_serializer(mode="wrap")
    def _omit_unset_top_k(self, handler: Any) -> Any:
        # Unset, top_k is left out of the dump that cache keys and dialogue fingerprints hash,
        # so that every answer cached before the field existed is still found.
        data = handler(self)
        if isinstance(data, dict) and data.get("top_k") is None:
            data.pop("top_k", None)
        return data

    def with_seed(self, seed: int | None) -> Sampling:
        """Seeded with a run's seed when it samples (None: unchanged). A greedy request
        (temperature 0) keeps its seed: the seed cannot change its answer, and a shared seed
        lets every run seed re-use the one cached greedy answer (and batch together)."""
        if seed is None or self.temperature == 0:
            return self
        return self.model_copy(update={"seed": seed})


class RoleSampling(_Frozen):
    """What a role's own output or protocol needs of its sampling, declared in the role's
    module beside its output schema. A model's defaults and a config's overrides cannot know
    these, so `apply` puts them over both; unset fields leave the configured value."""

    #: Room for the role's longest valid answer (its schema bounds the length), so that a
    #: constrained answer is never cut off.
    max_tokens: int | None = Field(None, gt=0)
    #: Room for the longest answer a grammar allows, where a configured length may be larger
    #: (then it stays).
    min_max_tokens: int | None = Field(None, gt=0)
    temperature: float | None = Field(None, ge=0.0)
    seed: int | None = None
    stop: tuple[str, ...] | None = None

    def apply(self, sampling: Sampling) -> Sampling:
        fixed = self.model_dump(exclude_none=True, exclude={"min_max_tokens"})
        if self.min_max_tokens is not None:
            fixed["max_tokens"] = max(
                fixed.get("max_tokens", sampling.max_tokens), self.min_max_tokens
            )
        return Sampling.model_validate({**sampling.model_dump(), **fixed})


class JsonSchemaOutput(_Frozen):
    """Output must be one JSON value valid against `json_schema`."""

    kind: Literal["json"] = "json"
    name: str = "output"
    json_schema: dict[str, Any]

    @classmethod
    def of(cls, model: type[BaseModel]) -> JsonSchemaOutput:
        return _schema_output(model)


@functools.cache
def _schema_output(model: type[BaseModel]) -> JsonSchemaOutput:
    """Built once per model class: pydantic's schema generation was a visible share of the
    pipeline's per-call overhead (every visit and every question asked for it again). Callers
    only read the spec (it is frozen)."""
    return JsonSchemaOutput(name=model.__name__, json_schema=model.model_json_schema())


class ChoiceOutput(_Frozen):
    """Output must be exactly one of `choices`."""

    kind: Literal["choice"] = "choice"
    choices: tuple[str, ...] = Field(min_length=1)


class RegexOutput(_Frozen):
    """Output must fully match `pattern` (Python `re` syntax, no flags)."""

    kind: Literal["regex"] = "regex"
    pattern: str


OutputSpec = Annotated[JsonSchemaOutput | ChoiceOutput | RegexOutput, Field(discriminator="kind")]


class ChatRequest(_Frozen):
    messages: tuple[Message, ...] = Field(min_length=1)
    sampling: Sampling = Sampling()
    output: OutputSpec | None = None

    @classmethod
    def of(
        cls,
        messages: list[dict[str, str]] | list[Message],
        output: OutputSpec | None = None,
        **sampling: Any,
    ) -> ChatRequest:
        msgs = tuple(m if isinstance(m, Message) else Message.model_validate(m) for m in messages)
        return cls(messages=msgs, sampling=Sampling(**sampling), output=output)

    def key(self, engine_identity: str, purpose: str = "evaluation") -> str:
        """Cache key: the purpose the answer serves, engine identity (which includes the model)
        + messages + sampling + output. Golden construction's answers are kept apart from an
        evaluation's: a greedy oracle sends golden construction's very requests (a greedy
        request keeps its fixed seed), and must not be answered by the run its nuggets came
        from."""
        payload = {
            "purpose": purpose,
            "engine": engine_identity,
            "request": self.model_dump(mode="json"),
        }
        blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


class PromptCount(_Frozen):
    """A request's prompt as the model sees it (chat template applied), counted by the model's
    own tokenizer, and the model's context window when the server says it."""

    tokens: int = Field(ge=0)
    window: int | None = Field(None, gt=0)


class Usage(_Frozen):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ChatResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str
    # The validated value of a constrained answer: the decoded JSON, the choice, or the match.
    parsed: Any = None
    finish_reason: Literal["stop", "length", "error"] = "stop"
    usage: Usage = Usage()
    latency_s: float = 0.0
    cached: bool = False
