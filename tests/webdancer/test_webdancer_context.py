"""The search agent's context window: prompts counted exactly (vLLM's `/tokenize`), `max_tokens`
clamped to the room left, and a context-length refusal (HTTP 400) handled as the forced answer.

GPU vLLM 0.11-0.13 refuse a request whose prompt plus `max_tokens` exceeds the window; the CPU
build (0.32 here) clamps `max_tokens` and refuses only a prompt that alone overflows. So the real
server shows the exact count, the clamp and its own 400; a loopback server answering with the
body GPU vLLM 0.11-0.13 send shows that 400 (the first turn our tests never saw)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import ClassVar

import pytest

from cts.serving.engine import ChatModel, EngineStats
from cts.serving.errors import ContextLengthExceeded
from cts.serving.openai_engine import OpenAIEngine, context_length_error
from cts.serving.types import ChatRequest, ChatResponse, PromptCount, Sampling
from cts.webdancer.agent import MAX_OVERFLOWS, AgentBudget, WebDancerAgent, searcher_sampling
from cts.webdancer.protocol import FORCE_ANSWER, observation
from cts.webdancer.tools import ToolResult
from tests.fault_helpers import QuietHandler, loopback_server

WINDOW = 2048  # the vllm_server fixture's --max-model-len
#: A Chinese search result, as a Chinese query brings back (the tiny model's tokenizer takes
#: about 1.8 tokens a character; `len // 3` counted a third of one).
PARAGRAPH = "北京是中华人民共和国的首都，也是全国的政治、文化和国际交往中心，历史悠久，名胜众多。"
SEARCH = (
    '<think>\n查一下\n</think>\n<tool_call>\n{"name": "search", "arguments": {"query": '
    '["北京 首都"]}}\n</tool_call>'
)

#: The body GPU vLLM 0.11-0.13 answer with (HTTP 400) when prompt + max_tokens exceed the window:
#: `OpenAIServing._validate_input`'s message inside `create_error_response`'s ErrorResponse.
VLLM_OVERFLOW = (
    "This model's maximum context length is {window} tokens. However, you requested {total} "
    "tokens ({prompt} in the messages, {completion} in the completion). Please reduce the "
    "length of the messages or completion."
)


class LongChineseResult:
    """The agent's tools, answering every call with `paragraphs` Chinese paragraphs."""

    def __init__(self, paragraphs: int) -> None:
        self.text = "\n".join(f"{i}. {PARAGRAPH}" for i in range(paragraphs))

    async def call(self, call: object, seed: int | None) -> ToolResult:
        return ToolResult(self.text)


class FirstTurnSearches:
    """The real engine, except that the first turn is a scripted search call (the tiny model
    is not trained on the protocol): every later turn, and every count, is the server's."""

    def __init__(self, inner: ChatModel) -> None:
        self.inner = inner
        self.identity = inner.identity
        self.model = inner.model
        self.requests: list[ChatRequest] = []

    @property
    def stats(self) -> EngineStats:
        return self.inner.stats

    async def chat(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        if len(self.requests) == 1:
            return ChatResponse(text=SEARCH)
        return await self.inner.chat(request)

    async def count_prompt_tokens(self, request: ChatRequest) -> PromptCount | None:
        return await self.inner.count_prompt_tokens(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class CannotCount(FirstTurnSearches):
    """The same, behind an engine that cannot count (the agent then estimates)."""

    async def count_prompt_tokens(self, request: ChatRequest) -> PromptCount | None:
        return None


def search(engine: ChatModel, paragraphs: int, **budget: int):
    sampling = searcher_sampling(constrained=False).apply(Sampling(max_tokens=1024, seed=0))
    agent = WebDancerAgent(
        engine,
        LongChineseResult(paragraphs),  # type: ignore[arg-type]
        sampling,
        AgentBudget(**{"max_llm_calls": 3, "max_context_tokens": 4096, **budget}),
        date="2026-11-30",
    )

    async def go():
        try:
            return await agent.run("北京是哪个国家的首都？")
        finally:
            await engine.aclose()

    return asyncio.run(go())


def llm_steps(result) -> list[dict]:
    return [s for s in result.steps if s["kind"] == "llm"]


def old_estimate(messages) -> int:
    """What the agent counted before: the last call's tokens plus `len // 3 + 1` of the new
    observation (here the first turn, scripted, reported no tokens)."""
    return len(messages[-1].content) // 3 + 1


@pytest.mark.vllm
def test_a_turn_is_counted_exactly_and_its_max_tokens_clamped(vllm_server):
    """A few Chinese paragraphs: the second turn's prompt, counted by the server's /tokenize,
    leaves less than the configured 1024 tokens of the server's 2048 (not the 4096 budget):
    max_tokens is clamped to the room left. The old `len // 3` estimate saw room for all 1024
    and sent them: GPU vLLM 0.11-0.13 answer that with HTTP 400."""
    engine = FirstTurnSearches(OpenAIEngine("smollm2-135m-instruct", vllm_server))
    result = search(engine, paragraphs=12, min_turn_tokens=128)
    assert result.error is None, result.error
    turn = llm_steps(result)[1]
    sent = engine.requests[1]
    exact = asyncio.run(_count(vllm_server, sent))
    assert exact.window == WINDOW
    assert turn["prompt_tokens"] == exact.tokens  # the server's usage: the count was exact
    assert turn["max_tokens"] == sent.sampling.max_tokens == WINDOW - exact.tokens < 1024
    assert not turn["final"]
    # Where the old estimate went wrong: it saw room for the whole 1024.
    assert old_estimate(sent.messages) + 1024 <= 4096 and exact.tokens + 1024 > WINDOW
    assert exact.tokens > 2 * old_estimate(sent.messages[-1:])


@pytest.mark.vllm
def test_a_long_chinese_observation_forces_the_answer_cut_to_fit(vllm_server):
    """Far more Chinese than the window holds: the forced answer, its observation cut until the
    counted prompt leaves the turn its room; the server takes it (no 400, no error)."""
    engine = FirstTurnSearches(OpenAIEngine("smollm2-135m-instruct", vllm_server))
    result = search(engine, paragraphs=80, min_turn_tokens=256)
    assert result.error is None and result.termination == "context_limit", result.steps
    final = llm_steps(result)[-1]
    assert final["final"] and len(engine.requests) == 2  # no refused request in between
    assert final["prompt_tokens"] + final["max_tokens"] <= WINDOW
    assert final["max_tokens"] >= 256
    last_user = engine.requests[-1].messages[-1].content
    assert "[… cut to fit the context window]" in last_user and last_user.endswith(FORCE_ANSWER)


@pytest.mark.vllm
def test_the_real_servers_own_400_is_the_forced_answer(vllm_server):
    """Without a count (an engine that cannot ask /tokenize), the estimate misses the Chinese
    and the prompt alone overflows: the CPU build refuses it (HTTP 400, its own message). The
    agent takes the server's figures, cuts, and answers within the window."""
    engine = CannotCount(OpenAIEngine("smollm2-135m-instruct", vllm_server))
    result = search(engine, paragraphs=40, max_context_tokens=WINDOW, min_turn_tokens=256)
    kinds = [s["kind"] for s in result.steps]
    assert "context_overflow" in kinds, result.steps
    overflow = next(s for s in result.steps if s["kind"] == "context_overflow")
    assert "maximum context length is 2048 tokens" in overflow["message"]
    assert result.error is None and result.termination == "context_limit"
    final = llm_steps(result)[-1]
    assert final["final"] and final["prompt_tokens"] + final["max_tokens"] <= WINDOW


async def _count(base_url: str, request: ChatRequest) -> PromptCount:
    engine = OpenAIEngine("smollm2-135m-instruct", base_url)
    try:
        counted = await engine.count_prompt_tokens(request)
    finally:
        await engine.aclose()
    assert counted is not None
    return counted


# -- GPU vLLM 0.11-0.13's refusal, from a loopback server --------------------------------------


class GpuVllm(QuietHandler):
    """Chat completions as GPU vLLM 0.11-0.13 validate them: prompt + max_tokens over the window
    is HTTP 400 with their exact body. Tokens are characters here (its own tokenizer), and it
    has no /tokenize (404), so the agent can only estimate; the refusal's figures are exact."""

    window = 6000

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        if not self.path.endswith("/chat/completions"):
            return self.send_json(404, {"detail": "Not Found"})
        prompt = sum(len(m["content"]) for m in body["messages"])
        completion = body["max_tokens"]
        if prompt + completion > self.window:
            message = VLLM_OVERFLOW.format(
                window=self.window, total=prompt + completion, prompt=prompt, completion=completion
            )
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            return self.send_json(400, {"error": error})
        text = "<think>\n够了\n</think>\n<answer>\n北京\n</answer>"
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        usage = {"prompt_tokens": prompt, "completion_tokens": 12}
        self.send_json(200, {"choices": [{**choice, "finish_reason": "stop"}], "usage": usage})

    seen: ClassVar[list[dict]] = []


@pytest.fixture
def gpu_vllm() -> Iterator[str]:
    GpuVllm.seen = []
    with loopback_server(GpuVllm) as url:
        yield f"{url}/v1"


def test_the_400_of_gpu_vllm_is_parsed_with_its_figures():
    message = VLLM_OVERFLOW.format(window=32768, total=40960, prompt=32768, completion=8192)
    body = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    error = context_length_error(400, json.dumps(body))
    assert isinstance(error, ContextLengthExceeded)
    assert (error.window, error.prompt_tokens, error.kind) == (32768, 32768, "context_length")
    flat = {"object": "error", "message": message, "type": "BadRequestError", "code": 400}
    older = context_length_error(400, json.dumps(flat))
    assert older is not None and older.prompt_tokens == 32768
    later = (
        "This model's maximum context length is 2048 tokens. However, your prompt contains at "
        "least 2049 input tokens, which exceeds this limit even without any output tokens."
    )
    clamping = context_length_error(400, json.dumps({"error": {"message": later}}))
    assert clamping is not None and (clamping.prompt_tokens, clamping.exact) == (2049, False)
    assert error.exact
    assert context_length_error(400, '{"error": {"message": "bad schema"}}') is None
    assert context_length_error(500, json.dumps(body)) is None


def test_a_context_length_400_is_the_forced_answer_not_an_error(gpu_vllm):
    """The second turn (a long Chinese observation) overflows prompt + max_tokens: GPU vLLM's
    400, which ended the search with an error before, is now the forced answer, its observation
    cut to the refusal's own figures; the retried request fits and answers."""
    engine = OpenAIEngine("webdancer", gpu_vllm, max_retries=0)
    result = search(FirstTurnSearches(engine), paragraphs=60, max_context_tokens=32768)
    assert result.error is None, result.error
    assert (result.termination, result.answer) == ("context_limit", "北京")
    refused = [s for s in result.steps if s["kind"] == "context_overflow"]
    # Each refusal teaches the agent the server's window and the sent prompt's exact tokens;
    # here tokens are characters, which the estimate of the English prompt misses by two thirds.
    assert 1 <= len(refused) <= MAX_OVERFLOWS
    assert re.fullmatch(
        VLLM_OVERFLOW.format(window=6000, total=r"\d+", prompt=r"\d+", completion=1024)
        .replace("(", r"\(")
        .replace(")", r"\)")
        .replace(".", r"\."),
        refused[0]["message"],
    )
    chats = [b for b in GpuVllm.seen if "max_tokens" in b]
    answered = chats[-1]
    prompt = sum(len(m["content"]) for m in answered["messages"])
    assert prompt + answered["max_tokens"] <= GpuVllm.window
    assert answered["messages"][-1]["content"].endswith(FORCE_ANSWER)
    assert observation("")[:16] in answered["messages"][-1]["content"]
