"""Byte-compatibility with the 200 real WebDancer trajectories, and the parser on every turn."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from cts.webdancer.protocol import (
    BAD_SEARCH,
    BAD_VISIT,
    INVALID_TOOL_CALL,
    FinalAnswer,
    ProtocolError,
    ToolCall,
    UnmarkedAnswer,
    cut_hallucinated_observation,
    first_user_turn,
    initial_messages,
    observation,
    parse_turn,
    system_prompt,
)


def _shared_candidates() -> list[Path]:
    """shared/ sits beside the checkout (sessions and CI); CTS_SHARED_DIR overrides."""
    found = [Path(os.environ["CTS_SHARED_DIR"])] if os.environ.get("CTS_SHARED_DIR") else []
    return [*found, Path(__file__).resolve().parents[3] / "shared"]


def trajectories() -> list[dict]:
    for shared in _shared_candidates():
        path = shared / "fixtures" / "webdancer" / "sample_traj.jsonl"
        if path.is_file():
            return [json.loads(line) for line in path.read_text().splitlines()]
    pytest.skip("the WebDancer fixtures (shared/fixtures/webdancer) are not beside the checkout")


def question_and_date(trajectory: dict) -> tuple[str, str]:
    system, user = trajectory["messages"][0]["content"], trajectory["messages"][1]["content"]
    date = re.search(r"Current date: (\d{4}-\d{2}-\d{2})$", system)
    assert date is not None
    return user.rsplit("User: ", 1)[1], date.group(1)


def test_rendered_prompts_equal_all_200_fixtures():
    rows = trajectories()
    assert len(rows) == 200
    exact = 0
    for row in rows:
        question, date = question_and_date(row)
        rendered = initial_messages(question, date)
        exact += rendered == [
            {"role": m["role"], "content": m["content"]} for m in row["messages"][:2]
        ]
    assert exact == 200


def test_parser_reads_every_assistant_turn_of_all_200_fixtures():
    calls = answers = 0
    for row in trajectories():
        turns = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        for i, text in enumerate(turns):
            parsed = parse_turn(text)
            if i < len(turns) - 1:
                block = text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0]
                expected = json.loads(block)
                assert parsed == ToolCall(expected["name"], expected["arguments"])
                calls += 1
            else:
                expected_answer = text.split("<answer>", 1)[1].split("</answer>", 1)[0]
                assert parsed == FinalAnswer(expected_answer.strip())
                answers += 1
    assert (calls, answers) == (222, 200)


def test_observations_are_wrapped_as_in_training():
    rows = trajectories()
    observed = rows[0]["messages"][3]["content"]
    inner = observed.removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")
    assert observation(inner) == observed


def test_system_prompt_refuses_a_bad_date():
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        system_prompt("30/11/2026")
    assert first_user_turn("q?").endswith("\n\nUser: q?")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '<think>x</think>\n<tool_call>\n{"name": "search", "arguments": {"query": ["a"]}}\n'
            "</tool_call>",
            ToolCall("search", {"query": ["a"]}),
        ),
        # json5: single quotes, trailing comma, unquoted key
        (
            "<think>x</think><tool_call>{name: 'visit', 'arguments': {'url': ['u'], 'goal': 'g',},}"
            "</tool_call>",
            ToolCall("visit", {"url": ["u"], "goal": "g"}),
        ),
        # arguments given as a JSON string
        (
            '<tool_call>{"name": "search", "arguments": "{\\"query\\": [\\"b\\"]}"}</tool_call>',
            ToolCall("search", {"query": ["b"]}),
        ),
        # only the first tool call is executed
        (
            '<tool_call>{"name": "search", "arguments": {"query": ["1"]}}</tool_call>'
            '<tool_call>{"name": "search", "arguments": {"query": ["2"]}}</tool_call>',
            ToolCall("search", {"query": ["1"]}),
        ),
        # an unterminated tool call still parses
        (
            '<think>x</think><tool_call>{"name": "search", "arguments": {"query": ["c"]}}',
            ToolCall("search", {"query": ["c"]}),
        ),
        ("<think>done</think>\n<answer>\nParis\n</answer>", FinalAnswer("Paris")),
        ("<think>done</think><answer>unterminated", FinalAnswer("unterminated")),
    ],
)
def test_parse_turn(text, expected):
    assert parse_turn(text) == expected


def test_a_hallucinated_observation_is_cut_off():
    text = (
        '<think>x</think><tool_call>{"name": "search", "arguments": {"query": ["a"]}}'
        "</tool_call>\n<tool_response>\nmade-up results\n</tool_response>\n<answer>"
        "made-up answer</answer>"
    )
    assert parse_turn(text) == ToolCall("search", {"query": ["a"]})
    assert cut_hallucinated_observation(text).endswith("</tool_call>\n")
    assert parse_turn("<answer>a</answer><tool_response>x") == FinalAnswer("a")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # The release's replies (qwen_agent + the demo's tools): a call whose JSON does not
        # parse goes to the tool named in its text, which refuses the arguments ...
        ('{"name": "search", "arguments": {"query": ["a"]}', BAD_SEARCH),
        ('{"name": "visit", "arguments": {"url": ["u"], "goal": "g"', BAD_VISIT),
        ('{"name": "search", "arguments": "query: [a"}', BAD_SEARCH),
        ('{"name": "search", "arguments": [1]}', BAD_SEARCH),
        # ... an unknown tool is refused first, whether its JSON parses or not ...
        ('{"name": "google", "arguments": {"query": ["a"]}}', "Tool google does not exists."),
        ('{"name": "google", "arguments": {"query": ["a"]', "Tool google does not exists."),
        ('{"name": "google", "arguments": [1]}', "Tool google does not exists."),
        # ... and where no name can be read, ours says what to fix.
        ("{name: search, arguments", INVALID_TOOL_CALL),
        ('["search"]', INVALID_TOOL_CALL),
        ('{"name": 3, "arguments": {}}', INVALID_TOOL_CALL),
    ],
)
def test_a_malformed_call_gets_the_releases_reply(body, message):
    assert parse_turn(f"<think>\nx\n</think>\n<tool_call>\n{body}\n</tool_call>") == (
        ProtocolError(message)
    )


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("<think>\nI think it is the Derby.\n</think>\nThe Epsom Derby.", "The Epsom Derby."),
        ("<think>I am not sure</think>", ""),
        ("<think>\nthe thinking never closed", ""),
        ("Paris, without any tags.", "Paris, without any tags."),
    ],
)
def test_a_turn_with_no_tool_call_and_no_answer_is_the_response(text, answer):
    """The release ends the run on such a turn ("not used any tool, skip out") and returns
    it: no error goes back to the model."""
    parsed = parse_turn(text)
    assert parsed == UnmarkedAnswer(answer) and isinstance(parsed, FinalAnswer)
