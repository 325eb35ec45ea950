"""A search backend that times out, answers HTTP 500, garbage or JSON of the wrong shape: the
agent sees an error observation (no crash, no hang), the run goes on to an answer or its budget,
and the failure is recorded in the tool step (issue 13 §2)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator

import pytest

from cts.serving.scripted import ScriptedEngine
from cts.serving.types import ChatRequest, Sampling
from cts.webdancer.agent import AgentBudget, WebDancerAgent, searcher_sampling
from cts.webdancer.backends.web_search import RetrievalServerSearch, SearxngSearch
from cts.webdancer.protocol import FORCE_ANSWER, ToolCall
from cts.webdancer.tool_cache import ToolCache
from cts.webdancer.tools import Tools
from cts.webdancer.visit import LocalPages, Visitor
from tests.fault_helpers import QuietHandler, loopback_server

#: Loose enough for a loaded 2-core machine, where a loopback answer can take 0.2 s.
TIMEOUT_S = 1.0


class Reply:
    """What the server answers next: a status, raw body bytes, and a delay before it."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b"{}"
        self.delay_s = 0.0
        self.requests = 0


@pytest.fixture
def server() -> Iterator[tuple[str, Reply]]:
    reply = Reply()

    class Handler(QuietHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            reply.requests += 1
            time.sleep(reply.delay_s)
            with contextlib.suppress(OSError):  # the client gave up (timeout)
                self.send_body(reply.status, reply.body)

        do_GET = _answer
        do_POST = _answer

    with loopback_server(Handler) as url:
        yield url, reply


def backend(kind: str, url: str):
    if kind == "searxng":
        return SearxngSearch(url, timeout_s=TIMEOUT_S)
    return RetrievalServerSearch(url, timeout_s=TIMEOUT_S)


GOOD = {
    "searxng": {"results": [{"title": "T", "url": "https://x.example/a", "content": "snip"}]},
    "retrieval": {"result": [[{"document": {"id": "D-1", "contents": '"T"\nsome text'}}]]},
}

#: fault → how the server answers (status, body, delay).
FAULTS = {
    "timeout": (200, None, 3 * TIMEOUT_S),
    "http_500": (500, b'{"error": "internal"}', 0.0),
    "garbage": (200, b"<html>oops</html>\x00\xff not json", 0.0),
    "wrong_shape_list": (200, b"[1, 2, 3]", 0.0),
    "wrong_shape_missing_key": (200, b'{"hits": []}', 0.0),
    "wrong_shape_items": (200, None, 0.0),  # the key is there, its items are not objects
}

WRONG_ITEMS = {
    "searxng": {"results": ["a", "b"]},
    "retrieval": {"result": [["a", 3]]},
}


def set_fault(reply: Reply, kind: str, fault: str) -> None:
    status, body, delay = FAULTS[fault]
    if body is None:
        body = json.dumps(
            WRONG_ITEMS[kind] if fault == "wrong_shape_items" else GOOD[kind]
        ).encode()
    reply.status, reply.body, reply.delay_s = status, body, delay


def tools_for(search, cache: ToolCache | None = None) -> Tools:
    summarizer = ScriptedEngine(lambda r: json.dumps({"evidence": "e", "summary": "s"}))
    return Tools(search, Visitor(LocalPages({}), summarizer, Sampling()), cache, top_k=5)


@pytest.mark.parametrize("kind", ["searxng", "retrieval"])
def test_a_healthy_backend_renders_hits(server, kind):
    url, reply = server
    set_fault(reply, kind, "timeout")
    reply.delay_s = 0.0
    result = asyncio.run(tools_for(backend(kind, url)).call(ToolCall("search", {"query": ["q"]})))
    assert not result.errors
    assert result.text.startswith("A Google search for 'q' found 1 results")


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("kind", ["searxng", "retrieval"])
def test_a_failing_backend_becomes_an_error_observation(server, kind, fault, tmp_path):
    url, reply = server
    set_fault(reply, kind, fault)
    cache = ToolCache(tmp_path / "tools.sqlite")
    tools = tools_for(backend(kind, url), cache)
    result = asyncio.run(tools.call(ToolCall("search", {"query": ["alpha", "beta"]})))
    # Each query's failure is in the text the model reads and in the recorded errors.
    assert set(result.errors) == {"alpha", "beta"}
    for query, error in result.errors.items():
        assert error and f"The search for '{query}' failed ({error})" in result.text
    assert result.doc_ids == [] and result.evidence == []
    if fault == "timeout":
        assert all("timed out" in e for e in result.errors.values())
    elif fault == "http_500":
        assert all("500" in e for e in result.errors.values())
    else:
        # Garbage or a wrong shape is an error, never a silent "No results found".
        assert "No results found" not in result.text
    # A failure is not cached: once the backend recovers, the same call is answered afresh.
    set_fault(reply, kind, "timeout")
    reply.delay_s = 0.0
    again = asyncio.run(tools.call(ToolCall("search", {"query": ["alpha", "beta"]})))
    assert not again.errors and not again.cached


def search_call(*queries: str) -> str:
    payload = {"name": "search", "arguments": {"query": list(queries)}}
    return f"<think>\nlook it up\n</think>\n<tool_call>\n{json.dumps(payload)}\n</tool_call>"


ANSWER = "<think>\nno luck\n</think>\n<answer>\nunknown\n</answer>"


def run_agent(script, tools: Tools, **budget):
    engine = ScriptedEngine(script)
    sampling = searcher_sampling(constrained=False).apply(Sampling(max_tokens=256))
    agent = WebDancerAgent(engine, tools, sampling, AgentBudget(**budget), date="2026-11-30")
    return asyncio.run(agent.run("q")), engine


@pytest.mark.parametrize("fault", ["timeout", "http_500", "garbage", "wrong_shape_missing_key"])
def test_the_agent_sees_the_failure_and_goes_on_to_an_answer(server, fault):
    url, reply = server
    set_fault(reply, "searxng", fault)
    answers = iter([search_call("Korvex battery"), ANSWER])
    result, engine = run_agent(lambda r: next(answers), tools_for(backend("searxng", url)))
    assert (result.termination, result.answer, result.error) == ("answer", "unknown", None)
    assert [s["kind"] for s in result.steps] == ["llm", "tool", "llm"]
    tool = result.steps[1]
    assert list(tool["errors"]) == ["Korvex battery"]
    assert tool["result"].startswith("The search for 'Korvex battery' failed (")
    observed = engine.requests[1].messages[-1].content
    assert observed == f"<tool_response>\n{tool['result']}\n</tool_response>"


def test_a_backend_that_always_fails_ends_at_the_budget(server):
    url, reply = server
    set_fault(reply, "retrieval", "http_500")

    def script(request: ChatRequest) -> str:
        return ANSWER if FORCE_ANSWER in request.messages[-1].content else search_call("x")

    result, _ = run_agent(script, tools_for(backend("retrieval", url)), max_llm_calls=4)
    assert (result.termination, result.llm_calls, result.answer) == ("max_calls", 4, "unknown")
    tools = [s for s in result.steps if s["kind"] == "tool"]
    assert len(tools) == 3 and all(s["errors"] for s in tools)
    assert reply.requests == 3


def test_a_url_httpx_refuses_is_a_failed_visit_not_a_failed_key():
    """httpx.InvalidURL is no HTTPError: a URL that urlsplit accepts and httpx refuses is
    reported to the agent like any unreachable page."""
    import httpx

    class RefusingPages:
        name = identity = "http"

        async def fetch(self, url: str):
            raise httpx.InvalidURL("Invalid non-printable ASCII character in URL")

    summarizer = ScriptedEngine(lambda r: json.dumps({"evidence": "e", "summary": "s"}))
    tools = Tools(None, Visitor(RefusingPages(), summarizer, Sampling()), None, top_k=5)
    result = asyncio.run(
        tools.call(ToolCall("visit", {"url": ["http://a.example/\x7f"], "goal": "g"}))
    )
    assert "non-printable" in str(result.errors) and not summarizer.requests


def test_a_lone_surrogate_in_tool_arguments_reaches_the_cache_and_backend_as_u_fffd(
    search, tmp_path
):
    """A model can write `\\ud800` in a JSON string; no cache key or request can encode it."""
    from cts.webdancer.protocol import parse_turn

    turn = parse_turn(
        '<tool_call>{"name": "search", "arguments": {"query": ["alpha \\ud800 beta"]}}</tool_call>'
    )
    assert turn == ToolCall("search", {"query": ["alpha \ufffd beta"]})
    cache = ToolCache(tmp_path / "tools.sqlite")
    result = asyncio.run(tools_for(search, cache).call(turn))
    assert not result.errors
    assert asyncio.run(tools_for(search, cache).call(turn)).text == result.text  # cached


def test_failed_searches_are_counted_in_the_record_summary_and_report(server, search):
    """The agent goes on after a failed search; the run's summary still says it happened."""
    from cts.eval.report.diagnostics import failures, judge_labels
    from cts.eval.report.warnings import warnings
    from cts.eval.run.pipeline import run_instance
    from tests.scripted import dev_instances as instances
    from tests.scripted import scripted_context as context

    url, reply = server
    set_fault(reply, "retrieval", "http_500")
    ctx, _ = context(search)
    ctx.agent.tools.search = backend("retrieval", url)  # every search answers HTTP 500
    records = [asyncio.run(run_instance(i, "oracle", 0, ctx)) for i in instances(2)]
    assert all(r.error is None for r in records)
    counted = [r.usage["search_tool_errors"] for r in records]
    assert all(n >= 1 for n in counted)
    summary = {"records": 2, "failure_policy": "exclude", "failures": failures(records)}
    assert summary["failures"]["tool_errors"] == {"total": sum(counted), "records": 2}
    summary["clarification"] = {"dialogue_mismatches": 0}
    summary["judge"] = judge_labels(records)
    assert any(
        f"{sum(counted)} searches or visits failed inside the search runs of 2 of 2" in w
        for w in warnings("sys", summary)
    )
