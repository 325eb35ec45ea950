"""The WebDancer loop: think → tool call → observation, until an answer or a budget runs out.

Budgets: at most `max_llm_calls` model calls, the last one reserved for a forced final answer,
and a context budget; when the next turn could overflow it, the model gets the release's
"maximum context length" message and answers. Every message, tool call, tool result (with the
doc ids and URLs it showed), token count and latency goes into the trace.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from serving.engine import ChatModel
from serving.errors import EngineError
from serving.types import ChatRequest, Message, RegexOutput, RoleSampling, Sampling
from webdancer.protocol import (
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
from webdancer.tools import Tools

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
    """Conservative estimate for text not yet seen by the model's tokenizer."""
    return len(text) // 3 + 1


def _shorten(observed: str, excess_tokens: int) -> str:
    """Drop about `excess_tokens` from the end of an observation, keeping its wrapper."""
    inner = observed.removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")
    keep = max(0, len(inner) - 4 * excess_tokens - 64)
    return observation(inner[:keep] + "\n[… cut to fit the context window]")


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
        context = 0  # tokens of the conversation so far, as the model last counted them
        while True:
            calls_left = self.budget.max_llm_calls - result.llm_calls
            over_context = context + sampling.max_tokens > self.budget.max_context_tokens
            final = calls_left <= 1 or over_context
            if final:
                result.termination = "context_limit" if over_context else "max_calls"
                if over_context and len(messages) > 2:
                    # Cut the latest observation so that the forced turn fits the window.
                    excess = context + sampling.max_tokens - self.budget.max_context_tokens
                    messages[-1] = {
                        "role": "user",
                        "content": _shorten(messages[-1]["content"], excess),
                    }
                # Joined to the last user turn (the latest observation) rather than replacing
                # it as the release does: nothing is lost, and roles keep alternating, which
                # strict chat templates require.
                messages[-1] = {
                    "role": "user",
                    "content": f"{messages[-1]['content']}\n\n{FORCE_ANSWER}",
                }
            try:
                text, usage = await self._llm(messages, sampling, final, result)
            except EngineError as e:
                result.termination, result.error = "error", f"{e.kind}: {e}"
                break
            context = usage
            turn = parse_turn(text)
            messages.append(
                {"role": "assistant", "content": cut_hallucinated_observation(text).strip()}
            )
            if isinstance(turn, FinalAnswer):
                result.answer = turn.text
                if not final:
                    result.termination = "answer"
                break
            if final:
                break  # the forced turn did not answer: keep the termination reason
            if isinstance(turn, ProtocolError):
                reply, step = turn.message, {"kind": "protocol_error", "message": turn.message}
            else:
                reply, step = await self._tool(turn, seed)
            result.steps.append(step)
            messages.append({"role": "user", "content": observation(reply)})
            context += _approx_tokens(messages[-1]["content"])
        result.seconds = time.perf_counter() - started
        return result

    async def _llm(
        self, messages: list[dict[str, str]], sampling: Sampling, final: bool, result: AgentResult
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
