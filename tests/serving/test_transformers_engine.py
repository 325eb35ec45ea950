"""The transformers engine on the tiny real model: constrained outputs are always valid."""

from __future__ import annotations

import asyncio
import random
import re

import pytest

from serving.errors import EngineError
from serving.outputs import validate_output
from serving.types import ChatRequest, ChoiceOutput, JsonSchemaOutput, RegexOutput

pytestmark = pytest.mark.slow

TOPICS = [
    "a laptop",
    "a hotel in Lyon",
    "the 2022 World Cup",
    "tax rules",
    "a hiking trail",
    "a vaccine",
    "a phone plan",
    "a film festival",
    "train tickets",
    "a museum",
]


def random_schema(rng: random.Random) -> dict:
    kinds = {
        "string": lambda: {"type": "string", "maxLength": rng.randint(5, 30)},
        "integer": lambda: {"type": "integer"},
        "boolean": lambda: {"type": "boolean"},
        "enum": lambda: {
            "enum": rng.sample(["time", "region", "scope", "entity", "numeric"], rng.randint(2, 4))
        },
        "array": lambda: {
            "type": "array",
            "items": {"type": "string", "maxLength": 12},
            "maxItems": rng.randint(1, 3),
        },
    }
    names = rng.sample(
        ["question", "answer", "year", "city", "label", "count", "ok", "tags"], rng.randint(1, 4)
    )
    properties = {name: kinds[rng.choice(list(kinds))]() for name in names}
    return {
        "type": "object",
        "properties": properties,
        "required": names,
        "additionalProperties": False,
    }


def ask(text: str, output, **sampling) -> ChatRequest:
    return ChatRequest.of([{"role": "user", "content": text}], output, **sampling)


async def gather(engine, requests):
    return await asyncio.gather(*(engine.chat(r) for r in requests))


def test_twenty_random_schemas_give_twenty_valid_answers(tiny_engine):
    rng = random.Random(20261130)
    specs = [JsonSchemaOutput(name=f"s{i}", json_schema=random_schema(rng)) for i in range(20)]
    requests = [
        ask(
            f"Describe {rng.choice(TOPICS)} as JSON.",
            spec,
            max_tokens=160,
            temperature=rng.choice([0.0, 0.8]),
            seed=i,
        )
        for i, spec in enumerate(specs)
    ]
    responses = asyncio.run(gather(tiny_engine, requests))
    for spec, r in zip(specs, responses, strict=True):
        assert r.finish_reason == "stop"
        assert r.parsed == validate_output(spec, r.text)
        assert set(r.parsed) == set(spec.json_schema["required"])


def test_twenty_choices_are_each_one_of_the_list(tiny_engine):
    rng = random.Random(7)
    pool = ["yes", "no", "unknown", "time", "region", "2023", "Paris", "a b c"]
    specs = [ChoiceOutput(choices=tuple(rng.sample(pool, rng.randint(2, 5)))) for _ in range(20)]
    requests = [ask(f"Pick one for {rng.choice(TOPICS)}.", spec, max_tokens=10) for spec in specs]
    for spec, r in zip(specs, asyncio.run(gather(tiny_engine, requests)), strict=True):
        assert r.text in spec.choices and r.parsed == r.text


def test_twenty_regexes_are_matched(tiny_engine):
    patterns = [
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
        r"(yes|no), because [a-z ]{3,20}\.",
        r"[A-Z][a-z]{2,10}",
        r"unknown|[0-9]{1,3} km",
        r"Q[1-4] 20[0-9]{2}",
    ]
    requests = [
        ask(f"Answer about {TOPICS[i % 10]}.", RegexOutput(pattern=patterns[i % 5]), max_tokens=40)
        for i in range(20)
    ]
    for i, r in enumerate(asyncio.run(gather(tiny_engine, requests))):
        assert re.fullmatch(patterns[i % 5], r.text), r.text


def test_concurrent_mixed_requests_are_all_answered(tiny_engine):
    requests = [
        ask("Say hello.", None, max_tokens=8),
        ask("Yes or no?", ChoiceOutput(choices=("yes", "no"))),
        ask("A year?", RegexOutput(pattern=r"(19|20)[0-9]{2}")),
        ask(
            "JSON please",
            JsonSchemaOutput(
                json_schema={
                    "type": "object",
                    "properties": {"q": {"type": "string", "maxLength": 10}},
                    "required": ["q"],
                }
            ),
        ),
    ] * 3
    before = tiny_engine.batches
    responses = asyncio.run(gather(tiny_engine, requests))
    assert len(responses) == 12 and all(r.text for r in responses)
    # Gathered, not one generate() per request.
    assert tiny_engine.batches - before < 12


def test_max_tokens_stop_strings_and_usage(tiny_engine):
    long, stopped = asyncio.run(
        gather(
            tiny_engine,
            [
                ask("Write a long story about the sea.", None, max_tokens=12),
                ask("Count from 1 to 20, separated by commas.", None, max_tokens=80, stop=["5"]),
            ],
        )
    )
    assert long.finish_reason == "length" and long.usage.completion_tokens == 12
    assert long.usage.prompt_tokens > 5
    assert stopped.finish_reason == "stop" and "5" not in stopped.text


def test_closing_stops_the_batch_being_generated_and_a_new_loop_generates_again(tiny_engine):
    """A stopped run closes its engines while a batch may still be generating in the worker
    thread (minutes for a long answer on a CPU): the batch stops at its next token instead of
    holding the process until it ends. The engine serves the next event loop as before."""
    story = ask("Write a long story about the sea.", None, max_tokens=400)
    asyncio.run(tiny_engine.aclose())
    assert tiny_engine.closing.is_set()
    (cut,) = tiny_engine._run_batch([story])  # what the worker thread runs
    assert cut.usage.completion_tokens <= 2
    again = asyncio.run(
        tiny_engine.chat(ask("Write a long story about the sea.", None, max_tokens=12))
    )
    assert not tiny_engine.closing.is_set() and again.usage.completion_tokens == 12


def test_greedy_answers_are_reproducible(tiny_engine):
    request = ask("Name a colour.", None, max_tokens=8)
    first = asyncio.run(tiny_engine.chat(request)).text
    assert asyncio.run(tiny_engine.chat(request)).text == first


def test_an_uncompilable_constraint_fails_only_its_own_request(tiny_engine):
    async def go():
        return await asyncio.gather(
            tiny_engine.chat(ask("A word?", RegexOutput(pattern=r"(?=a)[a-z]+"))),
            tiny_engine.chat(ask("Yes or no?", ChoiceOutput(choices=("yes", "no")))),
            return_exceptions=True,
        )

    bad, good = asyncio.run(go())
    assert isinstance(bad, EngineError) and "cannot compile output constraint" in str(bad)
    assert good.parsed in ("yes", "no")


def test_every_cjk_character_can_be_generated_under_a_constraint(tiny_engine):
    """The constraint's vocabulary is built from token bytes: tokens holding part of a UTF-8
    character are not collapsed to "�", so a Chinese span with "，" inside compiles, and a
    mixed span keeps its original spacing."""
    from agents.user_answerer import span_regex

    fused = (
        "我想报考北京大学人工智能专业的研究生，请问复试的分数线是多少，在 iPhone 15 Pro 上能用吗"
    )
    for forced in ("研究生，请问复试", "在 iPhone 15 Pro 上"):
        pattern = re.escape(forced)
        response = asyncio.run(
            tiny_engine.chat(
                ChatRequest.of(
                    [{"role": "user", "content": "Say it."}],
                    output=RegexOutput(pattern=pattern),
                    max_tokens=48,
                )
            )
        )
        assert response.text == forced
    asyncio.run(
        tiny_engine.chat(
            ChatRequest.of(
                [{"role": "user", "content": fused}],
                output=RegexOutput(pattern=span_regex(fused)),
                max_tokens=48,
            )
        )
    )


def test_token_bytes_of_byte_level_and_sentencepiece_vocabularies():
    from serving.transformers_engine import token_bytes

    # Byte-level BPE: "Ġ" is a space; "ä¸" and "Ń" are the bytes of "中" (e4 b8 ad) split; a
    # token added to the tokenizer is plain text and does not make the rest SentencePiece.
    byte_level = {"Ġthe": 0, "ä¸": 1, "Ń": 2, "<|endoftext|>": 3, "你好": 4}
    assert token_bytes(byte_level, {"<|endoftext|>"}, {"你好"}) == {
        b" the": [0],
        b"\xe4\xb8": [1],
        b"\xad": [2],
        "你好".encode(): [4],
    }
    # SentencePiece: "▁" is a space, <0xNN> a raw byte.
    sentencepiece = {"▁the": 0, "<0xE4>": 1, "中": 2, "</s>": 3}
    assert token_bytes(sentencepiece, {"</s>"}) == {
        b" the": [0],
        b"\xe4": [1],
        "中".encode(): [2],
    }


def test_engines_loading_at_once_each_answer_as_when_loaded_alone(tiny_path, tiny_engine):
    """Three engines of the tiny model (two with the shipped adapters, as the quickstart's
    searcher and User Answerer) asked at once load in their worker threads at once: each
    answers, and as the same engine loaded alone does. `from_pretrained` sets process-wide
    state (the default dtype, the meta device): loads that overlapped failed with "Cannot copy
    out of meta tensor" and a float/bfloat16 mismatch before loads were serialized."""
    from configs import CONFIG_DIR
    from serving.transformers_engine import TransformersEngine

    adapters = [None, "smollm2-135m-answerer", "smollm2-135m-searcher"]

    def engines() -> list[TransformersEngine]:
        return [
            TransformersEngine(
                "m", tiny_path, adapter=a and str(CONFIG_DIR / "models" / "adapters" / a)
            )
            for a in adapters
        ]

    request = ask("Name a colour.", None, max_tokens=8)

    async def together(group: list[TransformersEngine]) -> list[str]:
        return [r.text for r in await asyncio.gather(*(e.chat(request) for e in group))]

    async def alone(engine: TransformersEngine) -> str:
        return (await engine.chat(request)).text

    at_once = asyncio.run(together(engines()))
    assert at_once == [asyncio.run(alone(e)) for e in engines()]
    assert at_once[0] == asyncio.run(tiny_engine.chat(request)).text


def test_a_load_waits_for_the_generations_running_and_they_for_a_load_waiting():
    """The gate's order, by its state (no timing): a load asked for while a generation runs
    waits, and holds back generations asked for after it, until that generation ends."""
    import threading

    from serving.transformers_engine import _LoadGate

    gate, loaded, generated = _LoadGate(), threading.Event(), threading.Event()

    def load() -> None:
        with gate.loading():
            loaded.set()

    def generate() -> None:
        with gate.generating():
            generated.set()

    with gate.generating():
        loader = threading.Thread(target=load)
        loader.start()
        while gate._loads_waiting == 0:  # the load has asked (a point of progress)
            threading.Event().wait(0.01)
        late = threading.Thread(target=generate)
        late.start()
        assert not loaded.is_set() and not generated.is_set() and gate._generating == 1
    loader.join(timeout=60)
    late.join(timeout=60)
    assert loaded.is_set() and generated.is_set()
    assert (gate._generating, gate._loading, gate._loads_waiting) == (0, False, 0)


def test_an_engine_that_is_dropped_is_freed_with_its_weights(tiny_path):
    """Its compiled constraints are its own: nothing the process keeps holds a dropped engine
    (a cache on the class once held every engine a test session or a notebook built, ~0.3 GiB
    each, until the process ended)."""
    import gc
    import weakref

    from serving.transformers_engine import TransformersEngine

    engine = TransformersEngine("smollm2-135m-instruct", tiny_path, dtype="auto")
    request = ask("Yes or no?", ChoiceOutput(choices=("yes", "no")), max_tokens=3)
    assert asyncio.run(engine.chat(request)).text in ("yes", "no")
    dropped = weakref.ref(engine)
    del engine
    gc.collect()
    assert dropped() is None
