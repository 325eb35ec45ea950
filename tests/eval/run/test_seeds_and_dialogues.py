"""Numbers that mean what the protocol means: the run's seed reaches every sampled request (the
search agent's included), the oracle is not a replay of the golden run, and clarify@k extends
clarify@(k−1) by construction (one dialogue per instance and seed, kept on disk)."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from pathlib import Path

import pytest

from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.golden import GOLDEN
from cts.eval.run.config import load_experiment
from cts.eval.run.dialogue import Clarification, DialogueStore
from cts.eval.run.pipeline import run_instance
from cts.eval.run.records import RecordStore
from cts.eval.run.runner import run_keys
from cts.foundation.yaml_config import ConfigError
from cts.serving.cache import CachedEngine, ResponseCache
from cts.serving.types import ChatRequest, Sampling
from cts.webdancer.agent import AgentBudget, WebDancerAgent
from cts.webdancer.backends.local import LocalSearch
from cts.webdancer.tools import Tools
from cts.webdancer.visit import LocalPages, Visitor
from tests.scripted import scripted_context

K_CONDITIONS = ["clarify@1", "clarify@2", "clarify@3"]


def instances(n: int = 2):
    return load_instances(DatasetSource(path="sample", split="dev", limit=n))


def stochastic_searcher(request: ChatRequest) -> str:
    """Samples like a real searcher at temperature > 0: what it says depends on the request's
    seed (and on the conversation), so two seeds give two different search runs."""
    rng = random.Random(f"{request.sampling.seed}|{request.messages[-1].content}")
    turn = len(request.messages) // 2
    if turn == 1:
        question = request.messages[1].content.rsplit("User: ", 1)[1]
        words = question.split()
        query = " ".join(rng.sample(words, min(3, len(words))))
        call = {"name": "search", "arguments": {"query": [query]}}
    elif turn == 2:
        goal = f"facts {rng.randint(0, 999)}"
        call = {"name": "visit", "arguments": {"url": ["doc://A-0001"], "goal": goal}}
    else:
        return f"<think>\ndone\n</think>\n<answer>\nanswer {rng.randint(0, 10**6)}\n</answer>"
    return f"<think>\nstep\n</think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"


def sampling_context(search: LocalSearch, cache: ResponseCache | None = None, trace_dir=None):
    """Scripted roles, but a searcher and summarizer that sample (temperature 0.6)."""
    ctx, roles = scripted_context(search, trace_dir)
    roles["searcher"].script = stochastic_searcher
    searcher = roles["searcher"] if cache is None else CachedEngine(roles["searcher"], cache)
    visitor = Visitor(LocalPages(search.documents), roles["summarizer"], Sampling(temperature=0.6))
    ctx.agent = WebDancerAgent(
        searcher,
        Tools(search, visitor, top_k=3),
        Sampling(temperature=0.6),
        AgentBudget(max_llm_calls=3),
        date="2026-11-30",
    )
    return ctx, roles


def test_the_seed_reaches_the_search_agent_and_the_summarizer(search):
    (instance,) = instances(1)
    ctx, roles = sampling_context(search)

    async def go():
        return [await run_instance(instance, "blurred", seed, ctx) for seed in (0, 1)]

    zero, one = asyncio.run(go())
    assert zero.error is None and one.error is None
    assert zero.answer != one.answer  # two seeds, two different search runs
    searched = [r.sampling.seed for r in roles["searcher"].requests]
    assert searched == [0, 0, 0, 1, 1, 1]
    assert [r.sampling.seed for r in roles["summarizer"].requests] == [0, 1]
    # The judge stays greedy with its fixed seed whatever the run's seed.
    assert {(r.sampling.temperature, r.sampling.seed) for r in roles["judge"].requests} == {
        (0.0, 0)
    }


def test_greedy_requests_keep_their_seed_so_seeds_share_cached_answers():
    greedy, sampled = Sampling(), Sampling(temperature=0.7)
    assert greedy.with_seed(5) is greedy
    assert sampled.with_seed(5).seed == 5


def test_blurred_and_oracle_are_reused_across_clarifier_systems(search, tmp_path):
    """Two clarifier systems sharing the response cache: the second takes every blurred and
    oracle search call from the cache, per seed; its clarify@1 searches are its own."""
    data = instances(2)
    conditions, seeds = ["blurred", "clarify@1", "oracle"], [0, 1]
    cache = ResponseCache(tmp_path / "responses.sqlite")

    def run(ctx, run_dir: Path) -> list:
        store = RecordStore(run_dir)
        asyncio.run(
            run_keys(data, conditions, seeds, lambda i, c, s: run_instance(i, c, s, ctx), store)
        )
        return list(store.completed().values())

    first_ctx, _ = sampling_context(search, cache)
    first = run(first_ctx, tmp_path / "a")
    second_ctx, roles = sampling_context(search, cache)
    roles["clarifier"].script = lambda r: json.dumps({"question": "Which edition?"})
    # Its answers change the rewrite (the scripted rewriter itself ignores the Q&A).
    roles["rewriter"].script = lambda r: json.dumps(
        {"query": r.messages[-1].content.split("\n")[0] + " (which edition)"}
    )
    second = run(second_ctx, tmp_path / "b")
    assert all(r.error is None for r in first + second)
    for r in second:
        calls, cached = r.usage["search_llm_calls"], r.usage["search_cached_calls"]
        if r.condition in ("blurred", "oracle"):
            assert calls > 0 and cached == calls, r.key
        else:
            assert cached < calls, r.key
    by_key = {r.key: r.answer for r in first}
    assert all(by_key[r.key] == r.answer for r in second if r.condition != "clarify@1")


def test_the_oracle_is_an_independent_run_not_the_golden_one(search, tmp_path):
    (instance,) = instances(1)
    ctx, _ = sampling_context(search, trace_dir=tmp_path)
    golden_seed = ctx.golden.seed

    async def go():
        return (
            await run_instance(instance, GOLDEN, golden_seed, ctx),
            await run_instance(instance, "oracle", 0, ctx),
        )

    golden, oracle = asyncio.run(go())
    assert golden.error is None and oracle.error is None and golden.nuggets
    assert golden.search_query == oracle.search_query == instance.fused_query
    golden_trace = json.loads((tmp_path / golden.trace_id).read_text())
    oracle_trace = json.loads((tmp_path / oracle.trace_id).read_text())
    assert golden_trace["messages"] != oracle_trace["messages"]


def test_a_golden_seed_among_the_evaluation_seeds_is_refused():
    with pytest.raises(ConfigError, match=r"golden: .*golden.seed 1 is also an evaluation seed"):
        load_experiment(None, ["seeds=[0, 1]", "golden.seed=1"])
    assert load_experiment(None, ["seeds=[0, 1, 2]"]).experiment.golden.seed == 1000


def counting_clarifier():
    """A clarifier that never asks the same question twice: like a sampling server without
    the response cache, so only construction can make clarify@k extend clarify@(k−1)."""
    counter = itertools.count()
    return lambda request: json.dumps({"question": f"Which year, option {next(counter)}?"})


def counting_context(search: LocalSearch, dialogues: Path):
    """Scripted roles with the counting clarifier, keeping dialogues in `dialogues` (a new
    context is a new process: it knows only what is on disk)."""
    ctx, roles = scripted_context(search, store=DialogueStore(dialogues, "s"))
    roles["clarifier"].script = counting_clarifier()
    return ctx, roles


def test_clarify_at_k_extends_clarify_at_k_minus_1_without_the_cache(search, tmp_path):
    data = instances(2)
    ctx, roles = counting_context(search, tmp_path / "dialogues")
    store = RecordStore(tmp_path)
    asyncio.run(
        run_keys(data, K_CONDITIONS, [0, 1], lambda i, c, s: run_instance(i, c, s, ctx), store)
    )
    records = store.completed()
    assert all(r.error is None for r in records.values())
    for instance in data:
        for seed in (0, 1):
            three = records[(instance.id, "clarify@3", seed)]
            assert len(set(three.questions)) == 3
            for j in (1, 2):
                shorter = records[(instance.id, f"clarify@{j}", seed)]
                assert shorter.questions == three.questions[:j]
                assert shorter.answers == three.answers[:j]
                assert shorter.question_types == three.question_types[:j]
    # One 3-turn dialogue per (instance, seed), not 1 + 2 + 3 questions.
    assert len(roles["clarifier"].requests) == 2 * 2 * 3


def test_a_resumed_run_continues_the_recorded_dialogue(search, tmp_path):
    (instance,) = instances(1)
    dialogues = tmp_path / "dialogues"
    ctx, roles = counting_context(search, dialogues)
    one = asyncio.run(run_instance(instance, "clarify@1", 0, ctx))
    # A new process (a resumed or requeued job): clarify@3 takes the dialogue from disk.
    ctx, roles = counting_context(search, dialogues)
    three = asyncio.run(run_instance(instance, "clarify@3", 0, ctx))
    assert three.questions[:1] == one.questions and not roles["clarifier"].requests


def test_a_failing_turn_fails_only_the_conditions_that_need_it_and_a_retry_continues(
    search, tmp_path
):
    data = instances(1)
    store_dir = tmp_path / "dialogues"
    ctx, roles = scripted_context(search, store=DialogueStore(store_dir, "s"))
    answer = roles["user_answerer"].script
    roles["user_answerer"].script = lambda r: (
        RuntimeError("server down") if "model" in r.messages[-1].content else answer(r)
    )
    records = RecordStore(tmp_path)

    def run(ctx, retry: bool) -> dict:  # type: ignore[type-arg]
        asyncio.run(
            run_keys(
                data,
                K_CONDITIONS,
                [0],
                lambda i, c, s: run_instance(i, c, s, ctx),
                records,
                retry_failed=retry,
            )
        )
        return {r.condition: r for r in records.completed().values()}

    first = run(ctx, False)
    assert first["clarify@1"].error is None and first["clarify@2"].error is None
    failed = first["clarify@3"]
    assert failed.error["stage"] == "answer" and "server down" in failed.error["message"]
    assert failed.questions == first["clarify@2"].questions  # the turns before it are kept
    ctx, roles = scripted_context(search, store=DialogueStore(store_dir, "s"))
    again = run(ctx, True)
    assert again["clarify@3"].error is None
    assert again["clarify@3"].questions[:2] == first["clarify@2"].questions
    # Only the failed turn was asked again.
    assert len(roles["clarifier"].requests) == 1


def test_a_dialogue_asked_by_another_clarifier_is_not_reused(search, tmp_path):
    (instance,) = instances(1)
    dialogues = tmp_path / "dialogues"
    ctx, roles = counting_context(search, dialogues)
    first = asyncio.run(run_instance(instance, "clarify@1", 0, ctx))
    # Same run directory, the clarifier now sampling at another temperature.
    ctx, roles = scripted_context(search)
    sampling = {**ctx.sampling, "clarifier": Sampling(temperature=0.7, max_tokens=64)}
    ctx.clarification = Clarification(
        dict(roles), sampling, k_max=3, store=DialogueStore(dialogues, "s")
    )
    roles["clarifier"].script = lambda r: json.dumps({"question": "Which edition?"})
    again = asyncio.run(run_instance(instance, "clarify@1", 0, ctx))
    assert again.questions == ["Which edition?"] != first.questions


def test_every_sampling_role_of_a_key_is_seeded_with_its_seed(search):
    (instance,) = instances(1)
    ctx, roles = sampling_context(search)
    sampled = Sampling(temperature=0.7, max_tokens=64)
    for role in ("clarifier", "user_answerer", "rewriter"):
        ctx.sampling[role] = sampled
    ctx.clarification = Clarification(dict(roles), ctx.sampling, k_max=2)
    record = asyncio.run(run_instance(instance, "clarify@2", 7, ctx))
    assert record.error is None, record.error
    for role in ("clarifier", "user_answerer", "rewriter", "searcher", "summarizer"):
        assert {r.sampling.seed for r in roles[role].requests} == {7}, role
    assert {r.sampling.seed for r in roles["judge"].requests} == {0}


def test_a_golden_dataset_built_with_an_evaluation_seed_is_refused(tmp_path):
    from cts.eval.experiment import run_experiment

    (instance,) = instances(1)
    golden = instance.golden.model_copy(update={"seed": 0, "trace_id": "golden/x.json"})
    dataset = tmp_path / "gold.jsonl"
    dataset.write_text(instance.model_copy(update={"golden": golden}).model_dump_json() + "\n")
    resolved = load_experiment(None, [f"dataset.path={dataset}", "dataset.split=null"])
    with pytest.raises(ConfigError, match=r"seeds: 0 is the seed of the golden run of 1"):
        run_experiment(resolved, tmp_path / "run", show_progress=False)
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_golden_records_of_another_seed_are_not_silently_rebuilt(tmp_path):
    from cts.eval.data.schema import Record
    from cts.eval.experiment import build_golden
    from cts.eval.run.run_dir import Shard

    (instance,) = instances(1)
    RecordStore(tmp_path).append(Record(instance_id=instance.id, condition=GOLDEN, seed=0), Shard())
    with pytest.raises(ConfigError, match=r"golden records built with seed\(s\) \[0\]"):
        build_golden(load_experiment(None), tmp_path, show_progress=False)


def test_a_corrupt_dialogue_line_is_an_error_naming_file_and_line(tmp_path):
    from cts.eval.run.dialogue import DialogueFileError

    (tmp_path / "s.jsonl").write_text('{"instance_id": "a", "seed": 0}\n{"oops": 1}\n')
    with pytest.raises(DialogueFileError, match=r"s.jsonl:2: instance_id: .* — not a dialogue"):
        DialogueStore(tmp_path, "s").load("")


def test_a_dialogue_line_with_a_bad_field_is_an_error_naming_it(tmp_path):
    """As a records line's error does (records.parse_jsonl): file, line and field."""
    from cts.eval.run.dialogue import DialogueFileError

    (tmp_path / "s.jsonl").write_text('{"instance_id": "a", "seed": "zero"}\n')
    with pytest.raises(
        DialogueFileError,
        match=r"s.jsonl:1: seed: Input should be a valid integer.* — not a dialogue; fix or",
    ):
        DialogueStore(tmp_path, "s").load("")


def test_a_torn_dialogue_line_is_ignored_then_cut_off(tmp_path):
    from cts.eval.run.dialogue import Dialogue

    store = DialogueStore(tmp_path, "s")
    store.append(Dialogue(instance_id="a", seed=0, fingerprint="f"))
    with store.path.open("a") as f:
        f.write('{"instance_id": "b", "se')  # killed mid-write
    again = DialogueStore(tmp_path, "s")
    assert set(again.load("f")) == {("a", 0)}
    again.append(Dialogue(instance_id="c", seed=0, fingerprint="f"))
    again.append(Dialogue(instance_id="d", seed=0, fingerprint="f"))
    assert set(DialogueStore(tmp_path, "s").load("f")) == {("a", 0), ("c", 0), ("d", 0)}
    assert len(store.path.read_text().splitlines()) == 3
