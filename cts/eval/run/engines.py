"""One engine per distinct model of an experiment (roles on the same model share it), behind
the shared response cache; under `judge.deterministic` the judge sends its requests to its
model's engine one by one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import Role
from cts.eval.run.usage import metered
from cts.foundation.yaml_config import ConfigError
from cts.serving.batching import BatchingEngine, Unbatched
from cts.serving.cache import EVALUATION, CachedEngine, ResponseCache
from cts.serving.engine import ChatModel
from cts.serving.model_config import build_engine


@dataclass
class Engines:
    by_model: dict[str, ChatModel]
    roles: dict[Role, ChatModel]
    cache: ResponseCache | None
    #: What the cached answers (and the tool cache's visits) are for: see `for_purpose`.
    purpose: str = EVALUATION
    #: Role views over a shared engine with their own cache identity (the unbatched judge).
    views: tuple[ChatModel, ...] = ()

    def __post_init__(self) -> None:
        # Each role's calls are charged to the key in flight, per role (cts/eval/run/usage.py).
        self.roles = {role: metered(engine, role) for role, engine in self.roles.items()}

    def for_purpose(self, purpose: str) -> Engines:
        """Key every cached answer under `purpose` (cts.serving.cache.PURPOSES), before any call:
        golden construction's answers then never answer an evaluation run, whose oracle sends
        its very requests when the searcher is greedy."""
        self.purpose = purpose
        for engine in (*self.by_model.values(), *self.views):
            if isinstance(engine, CachedEngine):
                engine.purpose = purpose
        return self

    def stats(self) -> dict[str, object]:
        return {
            "models": {name: e.stats.as_dict() for name, e in self.by_model.items()},
            "cache": self.cache.stats() if self.cache is not None else None,
        }


@asynccontextmanager
async def open_engines(
    resolved: ResolvedExperiment, roles: list[Role] | None = None, use_cache: bool = True
) -> AsyncIterator[Engines]:
    experiment = resolved.experiment
    cache_config = experiment.cache
    cache = (
        ResponseCache(cache_config.resolved_path()) if use_cache and cache_config.enabled else None
    )
    by_model: dict[str, ChatModel] = {}
    by_role: dict[Role, ChatModel] = {}
    views: list[ChatModel] = []
    try:
        for role in roles or list(experiment.roles):
            ref = experiment.roles[role].model
            if ref not in by_model:
                by_model[ref] = build_engine(resolved.model_configs[ref], cache)
            by_role[role] = by_model[ref]
            if role == "judge" and experiment.judge.deterministic:
                by_role[role] = unbatched(by_model[ref], cache)
                views.append(by_role[role])
        yield Engines(by_model, by_role, cache, views=tuple(views))
    finally:
        for engine in by_model.values():
            await engine.aclose()
        if cache is not None:
            cache.close()


def unbatched(engine: ChatModel, cache: ResponseCache | None) -> ChatModel:
    """The judge's view of its model's engine under `judge.deterministic`: each request alone
    (cts/serving/batching.py Unbatched), behind the cache under its own identity. The engine stays
    shared: other roles on the same model are batched as before."""
    inner = engine.inner if isinstance(engine, CachedEngine) else engine
    if not isinstance(inner, BatchingEngine):
        raise ConfigError(
            f"judge.deterministic: the judge's engine {inner.identity} is not an in-process "
            "engine the toolkit batches (use engine transformers)"
        )
    view = Unbatched(inner)
    return CachedEngine(view, cache) if cache is not None else view
