"""What the bench hooks into a `cts run`: each role's requests recorded with their answers
(`Call`, saved as the request mix the ceiling, structured and prefix parts replay), each key's
admission timed, and zero-latency scripted engines swapped in for the configured ones.

Apart from the measurements because it patches the run's internals
(`cts.eval.experiment.open_engines`, `KeySlots.acquire`): it changes when those do.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import cts.eval.experiment
from bench.sim_server import sim_searcher
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.engines import Engines
from cts.eval.run.slots import KeySlots
from cts.serving.engine import ChatModel, Wrapped
from cts.serving.types import ChatRequest, ChatResponse

# -- recording the pipeline's requests -------------------------------------------------------------


@dataclass
class Call:
    """One request a role made, and what came back."""

    role: str
    request: ChatRequest
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    #: Answered by the response cache (or shared with an identical request in flight).
    cached: bool
    started: float
    ended: float

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "request": self.request.model_dump(mode="json")}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Call:
        return cls(**{**data, "request": ChatRequest.model_validate(data["request"])})


class RecordingModel(Wrapped):
    """A role's model (the `ChatModel` interface) that keeps every request and its answer."""

    def __init__(self, inner: ChatModel, role: str, calls: list[Call]) -> None:
        super().__init__(inner)
        self.role = role
        self.calls = calls

    async def chat(self, request: ChatRequest) -> ChatResponse:
        started = time.monotonic()
        response = await self.inner.chat(request)
        self.calls.append(
            Call(
                self.role,
                request,
                response.usage.prompt_tokens,
                response.usage.completion_tokens,
                response.finish_reason,
                response.cached,
                started,
                time.monotonic(),
            )
        )
        return response


@contextmanager
def recording(calls: list[Call]) -> Iterator[None]:
    """`cts run`'s engines (whatever opens them now: the scripted ones inside `scripted()`),
    each role's wrapped to record into `calls`."""
    inner = cts.eval.experiment.open_engines

    @asynccontextmanager
    async def opened(
        resolved: ResolvedExperiment, roles: Any = None, use_cache: bool = True
    ) -> AsyncIterator[Engines]:
        async with inner(resolved, roles, use_cache) as engines:
            engines.roles = {
                role: RecordingModel(engine, role, calls) for role, engine in engines.roles.items()
            }
            yield engines

    with mock.patch.object(cts.eval.experiment, "open_engines", opened):
        yield


def tokens_by_role(calls: Sequence[Call], field: str) -> dict[str, int]:
    """Each role's sum of `field` (prompt_tokens or completion_tokens) over `calls`."""
    summed: Counter[str] = Counter()
    for call in calls:
        summed[call.role] += getattr(call, field)
    return dict(summed)


def save_calls(path: Path, calls: list[Call]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(c.as_json()) + "\n" for c in calls))


def load_calls(path: Path) -> list[Call]:
    if not path.is_file():
        raise SystemExit(
            f"{path}: no recorded request mix; run the `pipeline` part first (or give --requests)"
        )
    return [Call.from_json(json.loads(line)) for line in path.read_text().splitlines() if line]


# -- scripted engines, and the keys' admissions ----------------------------------------------------


@contextmanager
def scripted() -> Iterator[None]:
    """`cts run` with every role on a zero-latency scripted engine (cts/serving/scripted.py, the
    searcher searching, visiting and answering as `sim_searcher`) behind the real cache."""
    from cts.serving.cache import CachedEngine, ResponseCache
    from cts.serving.scripted import scripted_roles

    @asynccontextmanager
    async def opened(
        resolved: ResolvedExperiment, roles: Any = None, use_cache: bool = True
    ) -> AsyncIterator[Engines]:
        config = resolved.experiment.cache
        cache = ResponseCache(config.resolved_path()) if use_cache and config.enabled else None
        engines = scripted_roles()
        engines["searcher"].script = sim_searcher
        by_role: dict[Any, ChatModel] = {
            role: CachedEngine(engines[role], cache) if cache is not None else engines[role]
            for role in roles or list(resolved.experiment.roles)
        }
        try:
            yield Engines({str(role): e for role, e in by_role.items()}, by_role, cache)
        finally:
            if cache is not None:
                cache.close()

    with mock.patch.object(cts.eval.experiment, "open_engines", opened):
        yield


@contextmanager
def admissions() -> Iterator[list[float]]:
    """When each key of a run took its first slot (time.monotonic())."""
    admitted: list[float] = []
    acquire = KeySlots.acquire

    async def recorded(self: KeySlots, resumed: bool = False, group: str = "") -> None:
        await acquire(self, resumed, group)
        if not resumed:
            admitted.append(time.monotonic())

    with mock.patch.object(KeySlots, "acquire", recorded):
        yield admitted
