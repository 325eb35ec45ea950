"""The WebDancer loop with scripted engines (logic and faults) and with the tiny real model."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest

from cts.eval.data.dataset import DatasetSource, corpus_path, load_corpus, load_instances
from cts.serving.errors import EngineError
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import ChatRequest, Sampling
from cts.webdancer.agent import FINAL_REGEX, AgentBudget, WebDancerAgent, searcher_sampling
from cts.webdancer.backends.local import LocalSearch
from cts.webdancer.protocol import BAD_SEARCH, FORCE_ANSWER, INVALID_TOOL_CALL
from cts.webdancer.tool_cache import ToolCache
from cts.webdancer.tools import Tools
from cts.webdancer.visit import LocalPages, Visitor


def search_call(*queries: str) -> str:
    payload = {"name": "search", "arguments": {"query": list(queries)}}
    return f"<think>\nlook it up\n</think>\n<tool_call>\n{json.dumps(payload)}\n</tool_call>"


ANSWER = "<think>\nfound it\n</think>\n<answer>\n30 hours\n</answer>"


@pytest.fixture(scope="module")
def corpus():
    return load_corpus("sample")


@pytest.fixture(scope="module")
def local_search(tmp_path_factory):
    return LocalSearch(corpus_path("sample"), tmp_path_factory.mktemp("index"))


def tools_for(search, corpus, summarizer=None, cache=None) -> Tools:
    summarizer = summarizer or ScriptedEngine(
        lambda r: json.dumps({"evidence": "quoted text", "summary": "what it says"})
    )
    return Tools(search, Visitor(LocalPages(corpus), summarizer, Sampling()), cache, top_k=5)


def agent(script, tools, **budget) -> tuple[WebDancerAgent, ScriptedEngine]:
    engine = ScriptedEngine(script)
    sampling = searcher_sampling(constrained=False).apply(Sampling(max_tokens=256))
    return WebDancerAgent(engine, tools, sampling, AgentBudget(**budget), date="2026-11-30"), engine


def turns(*texts):
    answers = iter(texts)
    return lambda request: next(answers)


def test_search_then_answer_with_a_complete_trace(local_search, corpus):
    a, engine = agent(
        turns(search_call("Korvex Aura Pro battery life"), ANSWER), tools_for(local_search, corpus)
    )
    result = asyncio.run(a.run("How long does the Korvex Aura Pro battery last?"))
    assert (result.answer, result.termination, result.llm_calls) == ("30 hours", "answer", 2)
    assert [s["kind"] for s in result.steps] == ["llm", "tool", "llm"]
    tool = result.steps[1]
    assert tool["tool"] == "search" and "A-0001" in tool["doc_ids"]
    assert tool["result"].startswith("A Google search for 'Korvex Aura Pro battery life' found")
    # The second request carries the observation exactly as in training.
    observed = engine.requests[1].messages[-1].content
    assert observed.startswith("<tool_response>\nA Google search for")
    assert observed.endswith("\n</tool_response>")
    assert engine.requests[0].sampling.stop == ("\n<tool_response>", "<tool_response>")
    assert result.doc_ids[0] in tool["doc_ids"]


@pytest.mark.parametrize(
    ("turn", "reply"),
    [
        ("<think>x</think><tool_call>{name: search, query</tool_call>", INVALID_TOOL_CALL),
        # The release's: the tool named in the text refuses the broken arguments.
        ('<tool_call>{"name": "search", "arguments": {"query": ["a"]}</tool_call>', BAD_SEARCH),
    ],
)
def test_malformed_tool_call_is_returned_as_the_observation_and_the_model_recovers(
    local_search, corpus, turn, reply
):
    a, engine = agent(turns(turn, ANSWER), tools_for(local_search, corpus))
    result = asyncio.run(a.run("q"))
    assert result.termination == "answer"
    assert engine.requests[1].messages[-1].content == f"<tool_response>\n{reply}\n</tool_response>"
    assert result.steps[1] == {"kind": "protocol_error", "message": reply}


def test_a_turn_without_tool_call_or_answer_ends_the_run_as_in_the_release(local_search, corpus):
    a, engine = agent(
        turns("<think>\nI think it is the Derby.\n</think>\nThe Epsom Derby.", ANSWER),
        tools_for(local_search, corpus),
    )
    result = asyncio.run(a.run("q"))
    assert (result.answer, result.termination, result.llm_calls) == (
        "The Epsom Derby.",
        "answer",
        1,
    )
    assert len(engine.requests) == 1 and result.messages[-1]["role"] == "assistant"


def test_max_calls_forces_a_final_answer(local_search, corpus):
    def script(request: ChatRequest) -> str:
        return ANSWER if FORCE_ANSWER in request.messages[-1].content else search_call("x")

    a, engine = agent(script, tools_for(local_search, corpus), max_llm_calls=3)
    result = asyncio.run(a.run("q"))
    assert (result.termination, result.llm_calls, result.answer) == ("max_calls", 3, "30 hours")
    last_user = engine.requests[-1].messages[-1]
    assert last_user.role == "user" and last_user.content.endswith(FORCE_ANSWER)
    assert last_user.content.startswith("<tool_response>")  # the observation is kept
    assert [m.role for m in engine.requests[-1].messages][-2:] == ["assistant", "user"]


def test_context_limit_forces_a_final_answer(local_search, corpus):
    def script(request: ChatRequest) -> str:
        return ANSWER if FORCE_ANSWER in request.messages[-1].content else search_call("Korvex")

    a, _ = agent(script, tools_for(local_search, corpus), max_llm_calls=20, max_context_tokens=2500)
    result = asyncio.run(a.run("q"))
    assert result.termination == "context_limit" and result.answer == "30 hours"
    assert result.llm_calls < 20


def test_a_forced_turn_that_does_not_answer_keeps_the_reason(local_search, corpus):
    a, _ = agent(lambda r: search_call("x"), tools_for(local_search, corpus), max_llm_calls=2)
    result = asyncio.run(a.run("q"))
    assert (result.termination, result.answer, result.llm_calls) == ("max_calls", "", 2)


def test_hallucinated_observation_is_cut_and_the_real_tool_runs(local_search, corpus):
    text = (
        search_call("Korvex Aura Pro") + "\n<tool_response>\ninvented results\n"
        "</tool_response>\n<answer>invented</answer>"
    )
    a, engine = agent(turns(text, ANSWER), tools_for(local_search, corpus))
    result = asyncio.run(a.run("q"))
    assert result.answer == "30 hours"
    sent = engine.requests[1].messages
    assert "invented" not in sent[-2].content and sent[-2].content.endswith("</tool_call>")
    assert sent[-1].content.startswith("<tool_response>\nA Google search for 'Korvex Aura Pro'")


def test_an_engine_error_ends_the_run_with_reason_error(local_search, corpus):
    a, _ = agent(lambda r: EngineError("server gone"), tools_for(local_search, corpus))
    result = asyncio.run(a.run("q"))
    assert result.termination == "error" and "server gone" in (result.error or "")


def test_visit_goes_through_the_summarizer(local_search, corpus):
    call = {
        "name": "visit",
        "arguments": {
            "url": ["https://www.korvex.example/audio/aura-pro/specs", "https://nowhere.example/x"],
            "goal": "battery life",
        },
    }
    text = f"<think>\nread it\n</think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    summarizer = ScriptedEngine(lambda r: json.dumps({"evidence": "7.5 hours", "summary": "ok"}))
    a, _ = agent(turns(text, ANSWER), tools_for(local_search, corpus, summarizer))
    result = asyncio.run(a.run("q"))
    tool = result.steps[1]
    assert tool["doc_ids"] == ["A-0001"]
    assert tool["result"].startswith(
        "The useful information in https://www.korvex.example/audio/aura-pro/specs for user "
        "goal battery life as follows: \n\nEvidence in page: \n7.5 hours\n\nSummary: \nok"
    )
    assert "The provided webpage content could not be accessed." in tool["result"]
    assert "https://nowhere.example/x" in tool["errors"]
    assert "battery life" in summarizer.requests[0].messages[0].content


def test_tool_cache_replays_identically_and_offline_miss_is_clear(local_search, corpus, tmp_path):
    path = tmp_path / "tools.sqlite"
    first = tools_for(local_search, corpus, cache=ToolCache(path))
    a, _ = agent(turns(search_call("Korvex Aura", "Lumen transit pass"), ANSWER), first)
    r1 = asyncio.run(a.run("q"))

    class Exploding:
        name = "local"
        identity = local_search.identity  # the same corpus: a replay of the same searches

        async def search(self, query, top_k):
            raise AssertionError("the backend was called on an offline replay")

    replay = tools_for(Exploding(), corpus, cache=ToolCache(path, offline=True))
    b, _ = agent(turns(search_call("Korvex Aura", "Lumen transit pass"), ANSWER), replay)
    r2 = asyncio.run(b.run("q"))
    assert r2.steps[1]["result"] == r1.steps[1]["result"] and r2.steps[1]["cached"]
    assert r2.steps[1]["doc_ids"] == r1.steps[1]["doc_ids"]

    c, _ = agent(turns(search_call("never searched"), ANSWER), replay)
    with pytest.raises(
        Exception,
        match=r"tools are offline and the tool cache .* has no search "
        r"call to backend 'local:bm25s-jieba-1:corpus-sha256=[0-9a-f]{64}' with arguments "
        r'\{"query":\["never searched"\],"top_k":5\}',
    ):
        asyncio.run(c.run("q"))


def test_the_agent_of_an_experiment_closes_the_tool_cache_it_opened(tmp_path):
    """`open_agent` opens the tool cache, so it closes it when the block ends, also when the
    block fails (an interrupted run); what was written stays for the next run."""
    from cts.eval.run.config import load_experiment
    from cts.eval.run.engines import Engines
    from cts.eval.run.search_agent import open_agent

    path = tmp_path / "tools.sqlite"
    resolved = load_experiment(None, [f"search.tool_cache={path}"])
    caches: list[ToolCache] = []

    identities: list[str] = []

    async def search_once(fail: bool):
        engine = ScriptedEngine(turns(search_call("Korvex Aura"), ANSWER))
        engines = Engines({"m": engine}, {"searcher": engine, "summarizer": engine}, None)
        async with open_agent(resolved, engines) as searching:
            caches.append(searching.tools.cache)
            identities.append(searching.tools.search.identity)
            result = await searching.run("q")
            if fail:
                raise RuntimeError("interrupted")
        return result

    first = asyncio.run(search_once(fail=False))
    assert not first.steps[1]["cached"]
    with pytest.raises(RuntimeError, match="interrupted"):
        asyncio.run(search_once(fail=True))
    for cache in caches:
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            cache.get("search", "local", {})
    replayed = ToolCache(path, offline=True)
    assert replayed.get("search", identities[0], {"query": ["Korvex Aura"], "top_k": 3})
    replayed.close()


@pytest.mark.slow
def test_tiny_model_in_constrained_mode_searches_and_answers(tiny_engine, local_search, corpus):
    questions = load_instances(DatasetSource(path="sample", split="dev", limit=3))
    tools = tools_for(local_search, corpus, summarizer=tiny_engine)
    agent_ = WebDancerAgent(
        tiny_engine,
        tools,
        searcher_sampling(constrained=True).apply(Sampling()),
        AgentBudget(max_llm_calls=3, max_context_tokens=8192),
        constrained=True,
        date="2026-11-30",
    )

    async def go():
        return await asyncio.gather(*(agent_.run(q.blurred_query) for q in questions))

    for result in asyncio.run(go()):
        assert result.termination in ("answer", "max_calls"), result.error
        assert result.answer
        assert result.llm_calls <= 3
        assert any(s["kind"] == "tool" for s in result.steps) or result.termination == "answer"
        assert result.messages[0]["content"].endswith("Current date: 2026-11-30")
    assert FINAL_REGEX
