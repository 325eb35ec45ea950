"""`judge.deterministic`: the judge's requests run alone on the in-process engine, so that its
labels depend on the request only, not on what else was queued with it. The batching logic with
a stub engine; the config refused where the toolkit does not batch; and, on the tiny real model,
two rejudges batched differently that give the very same labels."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import cts.eval.run.engines
from cts.eval.run.config import load_experiment
from cts.eval.run.engines import open_engines
from cts.eval.run.records import RecordStore
from cts.foundation.yaml_config import ConfigError
from cts.serving.batching import BatchingEngine, Unbatched
from cts.serving.cache import CachedEngine, ResponseCache
from cts.serving.errors import EngineError
from cts.serving.types import ChatRequest, ChatResponse, Usage


class Recording(BatchingEngine):
    """Answers each request with its own text; records the requests of every batch call."""

    kind = "recording"

    def __init__(self, max_batch_size: int = 8) -> None:
        super().__init__("m", "/nowhere", dtype="float32", max_batch_size=max_batch_size)
        self.calls: list[list[str]] = []

    def _run_batch(self, requests: list[ChatRequest]) -> list[ChatResponse | EngineError]:
        texts = [r.messages[-1].content for r in requests]
        self.calls.append(texts)
        return [
            ChatResponse(text=t, usage=Usage(prompt_tokens=1, completion_tokens=1)) for t in texts
        ]


def ask(text: str) -> ChatRequest:
    return ChatRequest.of([{"role": "user", "content": text}], seed=0)


def test_unbatched_requests_run_alone_while_the_others_share_a_batch():
    engine = Recording()
    alone = Unbatched(engine)

    async def go() -> list[str]:
        sent = [engine.chat(ask(f"b{i}")) for i in range(3)]
        sent += [alone.chat(ask(f"j{i}")) for i in range(3)]
        return [r.text for r in await asyncio.gather(*sent)]

    assert asyncio.run(go()) == ["b0", "b1", "b2", "j0", "j1", "j2"]
    # One batch of the three batched requests, then one call per unbatched request.
    assert sorted(map(sorted, engine.calls)) == [["b0", "b1", "b2"], ["j0"], ["j1"], ["j2"]]
    assert (engine.batches, engine.batched_requests, engine.unbatched_requests) == (4, 6, 3)
    assert engine.stats.calls == 6  # the view's calls count in the engine's stats
    assert alone.identity == engine.identity + "+unbatched"


def test_only_the_judge_gets_the_unbatched_view_under_its_own_cache_identity(tmp_path, monkeypatch):
    built: list[Recording] = []

    def build_engine(config, cache=None):  # type: ignore[no-untyped-def]
        built.append(Recording())
        return CachedEngine(built[-1], cache) if cache is not None else built[-1]

    monkeypatch.setattr(cts.eval.run.engines, "build_engine", build_engine)
    resolved = load_experiment(
        None,
        [
            "judge.deterministic=true",
            "roles.judge.model=smollm2-135m-instruct",
            f"cache.path={tmp_path}/responses.sqlite",
        ],
    )

    async def go() -> None:
        async with open_engines(resolved, ["clarifier", "judge"]) as engines:
            judge, clarifier = engines.roles["judge"], engines.roles["clarifier"]
            await asyncio.gather(
                *(judge.chat(ask(f"j{i}")) for i in range(2)),
                *(clarifier.chat(ask(f"c{i}")) for i in range(2)),
            )
            # The same request from the judge is not the clarifier's cached answer.
            await clarifier.chat(ask("j0"))

    asyncio.run(go())
    (engine,) = built  # one engine for the model both roles use
    assert sorted(map(sorted, engine.calls)) == [["c0", "c1"], ["j0"], ["j0"], ["j1"]]
    cache = ResponseCache(tmp_path / "responses.sqlite")
    assert len(cache) == 5
    cache.close()
    # Off, the judge shares the batches.
    built.clear()
    resolved = load_experiment(
        None, ["roles.judge.model=smollm2-135m-instruct", f"cache.path={tmp_path}/off.sqlite"]
    )
    asyncio.run(go())
    assert sorted(map(sorted, built[0].calls))[0] == ["c0", "c1", "j0", "j1"]


def test_deterministic_mode_is_refused_where_the_toolkit_does_not_batch():
    assert load_experiment(None, ["judge.deterministic=true"]).experiment.judge.deterministic
    with pytest.raises(ConfigError) as found:
        load_experiment(None, ["judge.deterministic=true", "roles.judge.model=qwen3-8b"])
    message = str(found.value)
    assert message.startswith("--set judge.deterministic: ")
    assert "'qwen3-8b' runs on engine 'openai'" in message and "VLLM_BATCH_INVARIANT=1" in message
    # Another role on a served model is no reason to refuse.
    load_experiment(None, ["judge.deterministic=true", "roles.clarifier.model=qwen3-8b"])


@pytest.mark.slow
def test_a_deterministic_judge_gives_the_same_labels_however_it_is_batched(
    tmp_path: Path, monkeypatch
):
    """Two rejudges of one run by the tiny real judge (transformers, in-process), two nuggets
    per judge call: one with a key at a time and batches of one, the other with four keys at
    once and batches of up to eight. Under judge.deterministic their labels, and the evidence
    quotes the judge wrote before each (which batching moves even where the tiny judge's
    labels stay `none`: bench/RESULTS.md), are the same."""
    import cts.eval.rejudge
    from cts.eval.rejudge import rejudge_experiment, rejudge_run
    from tests.eval.test_rejudge import make_source

    source = make_source(tmp_path, monkeypatch, "dataset.limit=2", "conditions=[blurred, oracle]")
    monkeypatch.setattr(cts.eval.rejudge, "open_engines", open_engines)  # the real engines
    model = "models.smollm2-135m-instruct"
    labels = []
    for name, concurrency, batch in (("one", 1, 1), ("four", 4, 8)):
        out = tmp_path / name
        overrides = [
            "judge.deterministic=true",
            "judge.batch_size=2",
            "judge.canary.enabled=false",
            f"concurrency={concurrency}",
            f"{model}.max_batch_size={batch}",
        ]
        resolved = rejudge_experiment(source, out, None, overrides)
        result = rejudge_run(resolved, source, out, show_progress=False)
        assert not result.outcome.interrupted
        records = RecordStore(out).completed()
        judged = {k: r.labels for k, r in records.items() if r.error is None}
        assert judged and all(judged.values())
        labels.append(judged)
    # Labels and the evidence quotes before them: the judge's whole answers are the same.
    assert labels[0] == labels[1]
