"""The WebDancer loop: think → tool call → observation, until an answer or a budget runs out.

Budgets: at most `max_llm_calls` model calls, the last one reserved for a forced final answer,
and a context window (the budget, or the server's own when smaller). Each turn's prompt is
counted exactly where the engine can (vLLM's `/tokenize`), else estimated; its `max_tokens` is
clamped to the room the window leaves, and when less than `min_turn_tokens` is left the model
gets the release's "maximum context length" message (the latest observation cut to fit) and
answers. A server's context-length refusal (HTTP 400) is that same forced answer, cut to the
server's own figures. Every message, tool call, tool result (with the doc ids and URLs it
showed), token count and latency goes into the trace.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from cts.serving.engine import ChatModel
from cts.serving.errors import ContextLengthExceeded, EngineError
from cts.serving.types import ChatRequest, Message, RegexOutput, RoleSampling, Sampling
from cts.webdancer.protocol import (
    FORCE_ANSWER,
    STOP,
    FinalAnswer,
    ProtocolError,
    ToolCall,
    cut_hallucinated_observation,
    initial_messages,
    observation,
    parse_turn,
)
from cts.webdancer.tools import Tools

Termination = Literal["answer", "max_calls", "context_limit", "error"]

# Constrained mode: a grammar per turn for models never trained on the protocol (the tiny
# model), so that they really call the tools. Bounded lengths keep every turn finite: the
# longest turn is about 450 characters, so such models get max_tokens >= 448 (a small model
# can spend a token per character; `searcher_sampling`).
_THINK = r"<think>\n[^<>]{1,150}\n</think>\n"
_QUERY = r'"[^"\\<>\n]{2,60}"'
_SEARCH = (
    r'<tool_call>\n\{"name": "search", "arguments": \{"query": \['
    + _QUERY
    + r"(, "
    + _QUERY
    + r")?\]\}\}\n</tool_call>"
)
_VISIT = (
    r'<tool_call>\n\{"name": "visit", "arguments": \{"url": \["https?://[^"\\<>\s]{4,120}"\]'
    r', "goal": "[^"\\<>\n]{3,80}"\}\}\n</tool_call>'
)
_ANSWER = r"<answer>\n[^<>]{1,200}\n</answer>"
TURN_REGEX = _THINK + "(" + "|".join((_SEARCH, _VISIT, _ANSWER)) + ")"
FINAL_REGEX = _THINK + _ANSWER


def searcher_sampling(constrained: bool) -> RoleSampling:
    """The protocol's stop strings (a turn ends at its tool call: the observation is the
    tool's to write), and in constrained mode room for the longest turn the grammar allows."""
    return RoleSampling(stop=STOP, min_max_tokens=448 if constrained else None)


@dataclass
class AgentBudget:
    max_llm_calls: int = 8
    max_context_tokens: int = 8192
    #: A turn's room below which the search stops and the model answers (or the configured
    #: max_tokens, when smaller): a turn cut shorter could not finish its thinking and tool call.
    min_turn_tokens: int = 4096


@dataclass
class AgentResult:
    answer: str
    termination: Termination
    messages: list[dict[str, str]]
    steps: list[dict[str, Any]] = field(default_factory=list)
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    error: str | None = None

    @property
    def doc_ids(self) -> list[str]:
        """Every corpus document a tool showed the model, first sight first."""
        seen: dict[str, None] = {}
        for step in self.steps:
            for doc_id in step.get("doc_ids", []):
                seen.setdefault(doc_id, None)
        return list(seen)

    @property
    def cached_llm_calls(self) -> int:
        """Model calls answered by the response cache (re-used from an earlier run)."""
        return sum(1 for step in self.steps if step["kind"] == "llm" and step["cached"])

    def as_dict(self) -> dict[str, Any]:
        """A view for writing (shallow: `asdict` deep-copied every step of every trace)."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "doc_ids": self.doc_ids}


def _approx_tokens(text: str) -> int:
    """Conservative estimate for text not yet seen by the model's tokenizer: about 3 characters
    a token for ASCII, a token (at least) for every other character (CJK text is about one
    character a token for Qwen's tokenizer, where `len // 3` was 2x under)."""
    ascii_chars = sum(1 for c in text if c < "\x80")
    return ascii_chars // 3 + (len(text) - ascii_chars) + 1


#: Context-length refusals (HTTP 400) one run may meet before it ends with an error.
MAX_OVERFLOWS = 3
#: Rounds of cutting the latest observation until the forced answer fits.
_CUT_ROUNDS = 4

Messages = list[dict[str, str]]


def _cut(observed: str, keep_chars: int) -> str:
    """The observation's first `keep_chars` characters, keeping its wrapper."""
    inner = observed.removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")
    return observation(inner[: max(0, keep_chars)] + "\n[… cut to fit the context window]")


def _with_force_answer(messages: Messages, observed: str) -> Messages:
    # Joined to the last user turn (the latest observation) rather than replacing it as the
    # release does: nothing is lost, and roles keep alternating, which strict chat templates
    # require.
    return [*messages[:-1], {"role": "user", "content": f"{observed}\n\n{FORCE_ANSWER}"}]


@dataclass
class _Context:
    """What a run knows of its context: the window (the budget, or the server's own when
    smaller), and the tokens of the conversation as the model last counted them."""

    window: int
    #: (messages counted, tokens): the last usage (prompt + completion) covers that many.
    counted: tuple[int, int] = (0, 0)
    #: The exact prompt tokens of one message list (a refusal's own figure).
    refused: tuple[tuple[str, ...], int] | None = None
    #: What the estimate missed of the last refused prompt, added to estimates until the next
    #: usage (the text before the latest observation is what it mostly misses).
    missed: int = 0
    overflows: int = 0

    def estimate(self, messages: Messages) -> int:
        n, tokens = self.counted
        if n > len(messages):
            n, tokens = 0, 0
        return tokens + sum(_approx_tokens(m["content"]) for m in messages[n:]) + self.missed

    def refusal(self, error: ContextLengthExceeded, sent: Messages) -> None:
        """Learn from a context-length refusal: the server's window, and the sent prompt's
        exact tokens (estimates are corrected by what they missed of it)."""
        self.overflows += 1
        self.window = min(self.window, error.window or self.window)
        if error.prompt_tokens is None:
            return
        tokens = error.prompt_tokens
        if not error.exact:
            # Only a lower bound ("at least W + 1"): assume twice the estimate, so that each
            # refusal at least halves what is kept.
            tokens = max(tokens, 2 * self.estimate(sent))
        self.refused = (tuple(m["content"] for m in sent), tokens)
        self.missed += tokens - self.estimate(sent)


@dataclass
class _Turn:
    messages: Messages
    sampling: Sampling
    final: bool
    over_context: bool


class WebDancerAgent:
    def __init__(
        self,
        engine: ChatModel,
        tools: Tools,
        sampling: Sampling,
        budget: AgentBudget | None = None,
        constrained: bool = False,
        date: str | None = None,
    ) -> None:
        self.engine = engine
        self.tools = tools
        #: The searcher's composed sampling (`searcher_sampling` holds what the protocol needs).
        self.sampling = sampling
        self.budget = budget or AgentBudget()
        self.constrained = constrained
        self.date = date or time.strftime("%Y-%m-%d")

    async def run(self, question: str, seed: int | None = None) -> AgentResult:
        """One search run. `seed` (the evaluation key's seed) seeds every sampled request of
        the run, the summarizer's included; None keeps the configured sampling's seed."""
        started = time.perf_counter()
        sampling = self.sampling.with_seed(seed)
        messages = initial_messages(question, self.date)
        result = AgentResult(answer="", termination="max_calls", messages=messages)
        context = _Context(window=self.budget.max_context_tokens)
        while True:
            calls_left = self.budget.max_llm_calls - result.llm_calls
            turn = await self._turn(messages, sampling, calls_left <= 1, context)
            if turn.final:
                result.termination = "context_limit" if turn.over_context else "max_calls"
            try:
                text, usage = await self._llm(turn.messages, turn.sampling, turn.final, result)
            except ContextLengthExceeded as e:
                # The server's window is smaller than counted (or nothing could count): the
                # forced answer, cut to the server's own figures.
                context.refusal(e, turn.messages)
                result.steps.append({"kind": "context_overflow", "message": str(e)})
                if context.overflows > MAX_OVERFLOWS:
                    result.termination, result.error = "context_limit", f"{e.kind}: {e}"
                    break
                continue
            except EngineError as e:
                result.termination, result.error = "error", f"{e.kind}: {e}"
                break
            messages[:] = turn.messages
            parsed = parse_turn(text)
            messages.append(
                {"role": "assistant", "content": cut_hallucinated_observation(text).strip()}
            )
            context.counted, context.missed = (len(messages), usage), 0
            if isinstance(parsed, FinalAnswer):
                result.answer = parsed.text
                if not turn.final:
                    result.termination = "answer"
                break
            if turn.final:
                break  # the forced turn did not answer: keep the termination reason
            if isinstance(parsed, ProtocolError):
                reply, step = parsed.message, {"kind": "protocol_error", "message": parsed.message}
            else:
                reply, step = await self._tool(parsed, seed)
            result.steps.append(step)
            messages.append({"role": "user", "content": observation(reply)})
        result.seconds = time.perf_counter() - started
        return result

    async def _turn(
        self, messages: Messages, sampling: Sampling, last_call: bool, context: _Context
    ) -> _Turn:
        """The next request: a search turn whose max_tokens is clamped to the room the window
        leaves, or, on the last call or when too little room is left, the forced answer (its
        latest observation cut until the answer has room)."""
        room = min(sampling.max_tokens, self.budget.min_turn_tokens)
        prompt = await self._prompt_tokens(messages, sampling, context)
        over = prompt + room > context.window
        if not (last_call or over):
            return _Turn(list(messages), _clamped(sampling, context.window - prompt), False, over)
        final = _with_force_answer(messages, messages[-1]["content"])
        if over and len(messages) > 2:
            final = await self._cut_to_fit(messages, sampling, room, context)
        prompt = await self._prompt_tokens(final, sampling, context)
        return _Turn(final, _clamped(sampling, context.window - prompt), True, over)

    async def _cut_to_fit(
        self, messages: Messages, sampling: Sampling, room: int, context: _Context
    ) -> Messages:
        """The forced-answer messages with the latest observation cut until their prompt leaves
        `room` tokens: each round drops the excess at the observation's own characters per
        token (measured by counting it out), then counts again."""
        observed = messages[-1]["content"]
        final = _with_force_answer(messages, observed)
        for _ in range(_CUT_ROUNDS):
            prompt = await self._prompt_tokens(final, sampling, context)
            excess = prompt + room - context.window
            if excess <= 0:
                break
            without = _with_force_answer(messages, observation(""))
            observed_tokens = max(1, prompt - await self._prompt_tokens(without, sampling, context))
            chars = len(observed) - len(observation(""))
            keep = chars - math.ceil(excess * chars / observed_tokens) - 64
            observed = _cut(observed, keep)
            final = _with_force_answer(messages, observed)
        return final

    async def _prompt_tokens(
        self, messages: Messages, sampling: Sampling, context: _Context
    ) -> int:
        """The prompt's tokens: the server's count (`/tokenize`), a refusal's figure for these
        very messages, else an estimate; a server that says its window narrows the budget."""
        if context.refused is not None and context.refused[0] == tuple(
            m["content"] for m in messages
        ):
            return context.refused[1]
        request = ChatRequest(
            messages=tuple(Message.model_validate(m) for m in messages), sampling=sampling
        )
        counted = await self.engine.count_prompt_tokens(request)
        if counted is None:
            return context.estimate(messages)
        if counted.window is not None:
            context.window = min(context.window, counted.window)
        return counted.tokens

    async def _llm(
        self, messages: Messages, sampling: Sampling, final: bool, result: AgentResult
    ) -> tuple[str, int]:
        output = None
        if self.constrained:
            output = RegexOutput(pattern=FINAL_REGEX if final else TURN_REGEX)
        request = ChatRequest(
            messages=tuple(Message.model_validate(m) for m in messages),
            sampling=sampling,
            output=output,
        )
        response = await self.engine.chat(request)
        result.llm_calls += 1
        result.prompt_tokens += response.usage.prompt_tokens
        result.completion_tokens += response.usage.completion_tokens
        result.steps.append(
            {
                "kind": "llm",
                "final": final,
                "text": response.text,
                "finish_reason": response.finish_reason,
                "max_tokens": sampling.max_tokens,
                "cached": response.cached,
                "prompt_tokens": response.usage.prompt_tokens,
                "completion_tokens": response.usage.completion_tokens,
                "latency_s": round(response.latency_s, 3),
            }
        )
        return response.text, response.usage.prompt_tokens + response.usage.completion_tokens

    async def _tool(self, call: ToolCall, seed: int | None) -> tuple[str, dict[str, Any]]:
        started = time.perf_counter()
        outcome = await self.tools.call(call, seed)
        return outcome.text, {
            "kind": "tool",
            "tool": call.name,
            "arguments": call.arguments,
            "result": outcome.text,
            "doc_ids": outcome.doc_ids,
            "urls": outcome.urls,
            "errors": outcome.errors,
            "evidence": outcome.evidence,
            "cached": outcome.cached,
            "latency_s": round(time.perf_counter() - started, 3),
        }


def _clamped(sampling: Sampling, room: int) -> Sampling:
    """`sampling` with max_tokens no more than the room the window leaves (at least 1: a prompt
    that fills the window alone is the server's to refuse)."""
    if room >= sampling.max_tokens:
        return sampling
    return sampling.model_copy(update={"max_tokens": max(1, room)})
