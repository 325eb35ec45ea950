"""The transformers engine on the tiny real model: constrained outputs are always valid."""

from __future__ import annotations

import asyncio
import random
import re

import pytest

from cts.serving.errors import EngineError
from cts.serving.outputs import validate_output
from cts.serving.types import ChatRequest, ChoiceOutput, JsonSchemaOutput, RegexOutput

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
    from cts.agents.user_answerer import span_regex

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


YEAR = {"type": "object", "properties": {"year": {"type": "integer"}}, "required": ["year"]}
QUICKSTART_ADAPTERS = [
    None,
    "smollm2-135m-answerer",
    "smollm2-135m-rewriter",
    "smollm2-135m-searcher",
]


def test_the_quickstarts_engines_started_cold_at_once_answer_as_when_alone(
    tiny_path, tiny_engine, monkeypatch
):
    """The quickstart's four engines of the tiny model (the base and its three adapters), cold,
    each asked a free and a constrained request at once, while another thread compiles: each
    answers, as the same engine loaded alone does, and no two model calls (a load or a
    generate) ever ran at once. Loads that overlapped failed with "Cannot copy out of meta
    tensor" and a float/bfloat16 mismatch; forwards that overlapped while any thread compiled
    failed with "expected an instance of Token" (a 12-instance run lost 8 of 12 clarifier
    keys to it). Not left to luck: the compile flag is on all along, and the first generate
    after the loads is held open until another call runs beside it (as generations did) or
    waits for its turn behind it."""
    import threading

    import torch
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    import cts.serving.transformers_engine as engine_module
    from cts.configs import CONFIG_DIR
    from cts.serving.transformers_engine import TransformersEngine

    inside, most, lock, hold = [0], [0], threading.Lock(), threading.Event()

    def queued_behind() -> bool:
        turns = getattr(engine_module, "_TURNS", None)
        return turns is not None and turns.waiting >= 2

    def counted(call):
        def wrapper(*args, **kwargs):
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                held, _ = hold.is_set(), hold.clear()
            try:
                while held and not (inside[0] >= 2 or queued_behind()):  # points of progress
                    threading.Event().wait(0.01)
                return call(*args, **kwargs)
            finally:
                with lock:
                    inside[0] -= 1

        return wrapper

    monkeypatch.setattr(LlamaForCausalLM, "generate", counted(LlamaForCausalLM.generate))
    load = AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", counted(load))

    def engines() -> list[TransformersEngine]:
        return [
            TransformersEngine(
                "m", tiny_path, adapter=a and str(CONFIG_DIR / "models" / "adapters" / a)
            )
            for a in QUICKSTART_ADAPTERS
        ]

    requests = [
        ask("Name a colour.", None, max_tokens=8),
        ask("Which year?", JsonSchemaOutput(json_schema=YEAR), max_tokens=16),
    ]

    async def together(group: list[TransformersEngine]) -> list[str]:
        asked = [e.chat(r) for e in group for r in requests]
        return [r.text for r in await asyncio.gather(*asked)]

    async def alone(engine: TransformersEngine) -> list[str]:
        return [(await engine.chat(r)).text for r in requests]

    cold = engines()
    with torch.compiler._compile_session_context():  # a compile elsewhere, all along
        assert torch.compiler.is_compiling()
        first = asyncio.run(together(cold))  # each loads in its worker thread, at once
        hold.set()
        again = asyncio.run(together(cold))  # loaded: only generations now
    assert most[0] == 1
    assert first == again == [t for e in engines() for t in asyncio.run(alone(e))]
    assert first[:2] == asyncio.run(alone(tiny_engine))


def test_a_fresh_process_generating_under_a_constraint_compiles_nothing(tiny_path, tmp_path):
    """outlines' own mask was a torch.compile'd kernel, compiled on the first constrained token
    of every process; while it compiled, the other engines' forwards broke. A fresh process
    (no kernel compiled before) now opens no compile session at all."""
    import subprocess
    import sys

    script = tmp_path / "cold.py"
    script.write_text(
        f"""
import asyncio, contextlib, torch.compiler
opened = []
real = torch.compiler._compile_session_context
@contextlib.contextmanager
def watched():
    opened.append(1)
    with real():
        yield
torch.compiler._compile_session_context = watched
from cts.serving.transformers_engine import TransformersEngine
from cts.serving.types import ChatRequest, ChoiceOutput
engine = TransformersEngine("m", {tiny_path!r})
yes_no = ChoiceOutput(choices=("yes", "no"))
request = ChatRequest.of([{{"role": "user", "content": "Yes?"}}], yes_no, max_tokens=3)
print(asyncio.run(engine.chat(request)).text, len(opened))
"""
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer, compiles = done.stdout.split()
    assert answer in ("yes", "no") and compiles == "0"


def test_an_engine_that_is_dropped_is_freed_with_its_weights(tiny_path):
    """Its compiled constraints are its own: nothing the process keeps holds a dropped engine
    (a cache on the class once held every engine a test session or a notebook built, ~0.3 GiB
    each, until the process ended)."""
    import gc
    import weakref

    from cts.serving.transformers_engine import TransformersEngine

    engine = TransformersEngine("smollm2-135m-instruct", tiny_path, dtype="auto")
    request = ask("Yes or no?", ChoiceOutput(choices=("yes", "no")), max_tokens=3)
    assert asyncio.run(engine.chat(request)).text in ("yes", "no")
    dropped = weakref.ref(engine)
    del engine
    gc.collect()
    assert dropped() is None
