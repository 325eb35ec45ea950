"""Each role's model calls, charged to the evaluation key that made them.

Roles share engines (one per model) and keys run concurrently, so an engine's own counters
cannot say which key or role a call was for. Every role's engine is wrapped in a
`MeteredModel` (cts/eval/run/engines.py), and `run_instance` opens a `KeyUsage` for its key in a
context variable: a call adds its usage to the key in whose task it runs, under its role. A
sequential clarification dialogue is one task shared by the clarify@k keys of an (instance,
seed); each of its turns is metered on its own and charged to the first key that takes it
(`charge`), so that clarify@1 carries turn 1, clarify@2 turn 2, and so on
(cts/eval/run/dialogue.py).

A record keeps the figures in `usage` as `<role>_calls`, `<role>_cached_calls`,
`<role>_prompt_tokens` and `<role>_completion_tokens`. Calls and tokens count requests that
reached a model (the work a server does); requests the response cache answered are counted
apart, in `_cached_calls`, and add no tokens.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields

from cts.serving.engine import ChatModel, Wrapped
from cts.serving.types import ChatRequest, ChatResponse


@dataclass
class RoleUsage:
    #: Requests that reached the model.
    calls: int = 0
    #: Requests the response cache answered (no model work, no tokens counted).
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


#: The figures of a role, as the suffixes of its `Record.usage` keys.
ROLE_FIGURES: tuple[str, ...] = tuple(f.name for f in fields(RoleUsage))


class KeyUsage:
    """What one key's requests cost, per role."""

    def __init__(self) -> None:
        self.roles: dict[str, RoleUsage] = {}

    def charge(self, role: str, response: ChatResponse) -> None:
        used = self.roles.setdefault(role, RoleUsage())
        if response.cached:
            used.cached_calls += 1
            return
        used.calls += 1
        used.prompt_tokens += response.usage.prompt_tokens
        used.completion_tokens += response.usage.completion_tokens

    def add(self, other: KeyUsage) -> None:
        for role, used in other.roles.items():
            mine = self.roles.setdefault(role, RoleUsage())
            for name in ROLE_FIGURES:
                setattr(mine, name, getattr(mine, name) + getattr(used, name))

    def fields(self) -> dict[str, int]:
        """The `Record.usage` entries of every role that made a request."""
        return {
            f"{role}_{name}": getattr(used, name)
            for role, used in sorted(self.roles.items())
            for name in ROLE_FIGURES
        }


_KEY: ContextVar[KeyUsage | None] = ContextVar("cts_key_usage", default=None)


@contextmanager
def charged_to_key() -> Iterator[KeyUsage]:
    """Requests made in this context (and in tasks started from it) are charged to the usage
    it yields."""
    usage = KeyUsage()
    token = _KEY.set(usage)
    try:
        yield usage
    finally:
        _KEY.reset(token)


def charge(usage: KeyUsage) -> None:
    """Add work another task did for this key (a shared dialogue's turns) to the key."""
    key = _KEY.get()
    if key is not None:
        key.add(usage)


class MeteredModel(Wrapped):
    """A role's engine (the `ChatModel` interface) that charges each answer to the key in
    flight; outside a key (a model check, a rejudge) it only passes calls through."""

    def __init__(self, inner: ChatModel, role: str) -> None:
        super().__init__(inner)
        self.role = role

    async def chat(self, request: ChatRequest) -> ChatResponse:
        response = await self.inner.chat(request)
        usage = _KEY.get()
        if usage is not None:
            usage.charge(self.role, response)
        return response


def metered(engine: ChatModel, role: str) -> MeteredModel:
    """`engine` charging to `role`; never metered twice."""
    if isinstance(engine, MeteredModel):
        engine = engine.inner
    return MeteredModel(engine, role)


def role_usage(usage: Mapping[str, int], role: str) -> RoleUsage | None:
    """A role's figures from a record's `usage`; None when the record has none for it."""
    if f"{role}_calls" not in usage:
        return None
    return RoleUsage(**{name: int(usage.get(f"{role}_{name}", 0)) for name in ROLE_FIGURES})
