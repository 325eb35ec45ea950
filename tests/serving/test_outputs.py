from __future__ import annotations

import pytest
from pydantic import BaseModel

from cts.serving.errors import ConstrainedOutputError
from cts.serving.outputs import validate_output
from cts.serving.types import ChatRequest, ChoiceOutput, JsonSchemaOutput, RegexOutput


class Answer(BaseModel):
    value: str
    count: int


SCHEMA = JsonSchemaOutput.of(Answer)


@pytest.mark.parametrize(
    ("spec", "text", "parsed"),
    [
        (SCHEMA, '{"value": "x", "count": 2}', {"value": "x", "count": 2}),
        (ChoiceOutput(choices=("yes", "no")), "no", "no"),
        (RegexOutput(pattern=r"[0-9]{4}"), "2024", "2024"),
    ],
)
def test_valid_answers_parse(spec, text, parsed):
    assert validate_output(spec, text) == parsed


@pytest.mark.parametrize(
    ("spec", "text", "message"),
    [
        (SCHEMA, "not json", "not JSON"),
        (SCHEMA, '{"value": "x"}', "'count' is a required property"),
        (SCHEMA, '{"value": "x", "count": "two"}', "at count"),
        (ChoiceOutput(choices=("yes", "no")), "maybe", "not one of"),
        (ChoiceOutput(choices=("yes", "no")), "yes ", "not one of"),
        (RegexOutput(pattern=r"[0-9]{4}"), "2024!", "does not match"),
    ],
)
def test_violations_raise(spec, text, message):
    with pytest.raises(ConstrainedOutputError, match=message):
        validate_output(spec, text)


def test_cache_key_covers_everything_that_changes_the_answer():
    base = ChatRequest.of([{"role": "user", "content": "hi"}], seed=0)
    key = base.key("engine-a")
    assert key == ChatRequest.of([{"role": "user", "content": "hi"}], seed=0).key("engine-a")
    variants = [
        base.key("engine-b"),
        ChatRequest.of([{"role": "user", "content": "hi!"}], seed=0).key("engine-a"),
        ChatRequest.of([{"role": "user", "content": "hi"}], seed=1).key("engine-a"),
        ChatRequest.of([{"role": "user", "content": "hi"}], seed=0, temperature=0.7).key(
            "engine-a"
        ),
        ChatRequest.of([{"role": "user", "content": "hi"}], SCHEMA, seed=0).key("engine-a"),
        ChatRequest.of(
            [{"role": "user", "content": "hi"}], ChoiceOutput(choices=("a",)), seed=0
        ).key("engine-a"),
    ]
    assert len({key, *variants}) == len(variants) + 1
