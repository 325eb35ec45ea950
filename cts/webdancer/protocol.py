"""The WebDancer text protocol, byte-compatible with the trajectories the checkpoints were
trained on (shared/fixtures/webdancer/sample_traj.jsonl; WebDancer, Alibaba-NLP, MIT).

Rendering: a persona system prompt ending `Current date: YYYY-MM-DD`; a first user turn holding
the `<tools>` block, the format instructions and `User: <question>`; observations as user turns
`<tool_response>\\n…\\n</tool_response>`. Parsing: an assistant turn is `<think>…</think>` then
either `<tool_call>{json}</tool_call>` or `<answer>…</answer>`. The prompt texts live verbatim in
prompts/ (see NOTICE) because a drifting prompt costs the trained model accuracy.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import json5

from cts.serving.outputs import valid_unicode

#: Generation stops before the model writes an observation itself (as in the release).
STOP = ("\n<tool_response>", "<tool_response>")
# How the WebDancer release (qwen_agent's NousFnCallPrompt and Agent._call_tool, the demo's
# tools) answers a malformed call. No released trajectory holds an error observation, so the
# model never saw one in training; these are matched for fidelity to the code the study ran.
#: A tool's own refusal of arguments it cannot read; for a call whose JSON does not parse,
#: qwen_agent reads the tool's name off the text and hands the tool the broken arguments.
BAD_SEARCH = "[Search] Invalid request format: Input must be a JSON object containing 'query' field"
BAD_VISIT = (
    "[Visit] Invalid request format: Input must be a JSON object containing 'url' and 'goal' fields"
)
BAD_ARGUMENTS = {"search": BAD_SEARCH, "visit": BAD_VISIT}
#: qwen_agent's answer to a tool it does not have ("exists" sic).
UNKNOWN_TOOL = "Tool {name} does not exists."
#: Ours, not the release's: a tool call whose name cannot be read (not a JSON object, or no
#: `"name": "…"` in its text). The release would answer `Tool  does not exists.` (an empty
#: name) or, for a JSON object lacking "name" or "arguments", end the run; this message says
#: what to fix. The text is the Tongyi DeepResearch / WebSailor react agent's.
INVALID_TOOL_CALL = (
    'Error: Tool call is not a valid JSON. Tool call must contain a valid "name" and '
    '"arguments" field.'
)
#: The release's forced final-answer turn at the context limit (WebSailor / Tongyi DR).
FORCE_ANSWER = (
    "You have now reached the maximum context length you can handle. You should stop making "
    "tool calls and, based on all the information above, think again and provide what you "
    "consider the most likely answer in the following format:<think>your final thinking"
    "</think>\n<answer>your answer</answer>"
)
TOOL_NAMES = ("search", "visit")


@cache
def _prompt(name: str) -> str:
    return resources.files("cts.webdancer").joinpath("prompts", name).read_text(encoding="utf-8")


def system_prompt(date: str) -> str:
    """The persona, ending with `Current date: YYYY-MM-DD`."""
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        raise ValueError(f"date must be YYYY-MM-DD, got {date!r}")
    return f"{_prompt('system.txt')}\nCurrent date: {date}"


def first_user_turn(question: str) -> str:
    """The tools block, the format instructions and the question."""
    return f"{_prompt('user_prefix.txt')}User: {question}"


def initial_messages(question: str, date: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": system_prompt(date)},
        {"role": "user", "content": first_user_turn(question)},
    ]


def observation(result: str) -> str:
    """A tool result as the user turn the model was trained to read."""
    return f"<tool_response>\n{result}\n</tool_response>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class FinalAnswer:
    text: str


@dataclass(frozen=True)
class UnmarkedAnswer(FinalAnswer):
    """A turn with neither `<tool_call>` nor `<answer>`: the release ends the run with it as
    the response (qwen_agent: "not used any tool, skip out"). `text` is what follows the
    thinking: the answer is scored, the reasoning is not."""


@dataclass(frozen=True)
class ProtocolError:
    """The turn broke the protocol; `message` goes back to the model as the tool response."""

    message: str


Turn = ToolCall | FinalAnswer | ProtocolError

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)


def cut_hallucinated_observation(text: str) -> str:
    """Drop anything from a `<tool_response>` the model wrote itself (when a server ignored the
    stop sequence): observations only come from tools."""
    return text.split("<tool_response>", 1)[0]


def loads_tolerant(raw: str) -> Any:
    """JSON, then JSON5 (single quotes, trailing commas, unquoted keys, comments); ValueError
    for anything else."""
    try:
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return json5.loads(raw)
    except RecursionError as e:
        # Both parsers recurse per nesting level; a model can write `[[[[...` past the limit.
        raise ValueError("JSON nested too deeply") from e


def parse_turn(text: str) -> Turn:
    """Read one assistant turn. Only the first tool call is executed; a turn that calls a tool
    before answering is a tool call (it has not seen the result yet)."""
    text = cut_hallucinated_observation(text)
    call = _TOOL_CALL.search(text)
    answer = _ANSWER.search(text)
    if call and (not answer or call.start() < answer.start()):
        return _parse_call(call.group(1).strip())
    if answer:
        return FinalAnswer(answer.group(1).strip())
    return UnmarkedAnswer(_after_thinking(text))


#: qwen_agent's `extract_fn`: the tool's name read off a call whose JSON does not parse.
_NAME = re.compile(r'"name"\s*:\s*"([^"]*)"')


def _parse_call(raw: str) -> ToolCall | ProtocolError:
    """One `<tool_call>` body, refused as the release refuses it: an unknown tool first, then
    arguments the tool cannot read."""
    try:
        payload = loads_tolerant(raw)
    except ValueError:
        name = _NAME.search(raw)
        return _refused(name.group(1)) if name else ProtocolError(INVALID_TOOL_CALL)
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ProtocolError(INVALID_TOOL_CALL)
    name = payload["name"]
    if name not in TOOL_NAMES:
        return _refused(name)
    # No "arguments" at all: the tool refuses the empty object (the release ends the run).
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = loads_tolerant(arguments)
    if not isinstance(arguments, dict):
        return _refused(name)
    try:
        # A lone surrogate made U+FFFD: no tool, cache key or backend request could
        # encode one.
        arguments = valid_unicode(arguments)
    except RecursionError:
        return _refused(name)
    return ToolCall(name, arguments)


def _refused(name: str) -> ProtocolError:
    """The release's reply to a call of `name` whose arguments cannot be used."""
    if name in TOOL_NAMES:
        return ProtocolError(BAD_ARGUMENTS[name])
    return ProtocolError(UNKNOWN_TOOL.format(name=name))


def _after_thinking(text: str) -> str:
    """The turn's text after its `<think>` block (none when the thinking never closed)."""
    _, closed, after = text.rpartition("</think>")
    if closed:
        return after.strip()
    return "" if "<think>" in text else text.strip()
