"""The roles: prompts, schemas, and the guarantees each one makes."""

from __future__ import annotations

import asyncio
import json

import pytest

from cts.agents import clarifier, judge, rewriter, user_answerer
from cts.agents.question_type import QUESTION_TYPES, classify_with_model
from cts.agents.types import QA
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Nugget
from cts.eval.score.metrics import LABEL_SCORE, restore_score
from cts.serving.errors import ConstrainedOutputError
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import Sampling

SAMPLING = Sampling(max_tokens=64)


def test_clarifier_sees_the_blurred_query_and_history_only():
    engine = ScriptedEngine(lambda r: json.dumps({"question": "Which year do you mean?"}))
    history = [QA(question="Which city?", answer="unknown")]
    turn = asyncio.run(clarifier.ask(engine, "ticket prices", history, "en", SAMPLING))
    assert turn.question == "Which year do you mean?" and not turn.stop
    prompt = engine.requests[0].messages[1].content
    assert "ticket prices" in prompt and "Q1: Which city?\nA1: unknown" in prompt
    assert engine.requests[0].output.json_schema["required"] == ["question"]


def test_clarifier_may_stop_early_when_allowed():
    engine = ScriptedEngine(lambda r: json.dumps({"question": "none needed", "stop": True}))
    turn = asyncio.run(clarifier.ask(engine, "q", [], "zh", SAMPLING, allow_stop=True))
    assert turn.stop
    assert "搜索查询：q" in engine.requests[0].messages[1].content


def test_rewriter_never_gets_the_fused_query_and_keeps_unknowns_open():
    engine = ScriptedEngine(lambda r: json.dumps({"query": "night train tickets 2024"}))
    pairs = [
        QA(question="Which year?", answer="2024"),
        QA(question="Which city?", answer="unknown"),
    ]
    query = asyncio.run(rewriter.rewrite(engine, "night train tickets", pairs, "en", SAMPLING))
    assert query == "night train tickets 2024"
    prompt = engine.requests[0].messages[1].content
    assert "A1: 2024" in prompt and "A2: unknown" in prompt and "do not guess" in prompt


def nuggets(n: int) -> list[Nugget]:
    return [Nugget(id=f"n{i}", text=f"fact {i}", weight=1 + i % 3) for i in range(n)]


def test_judge_sends_batches_of_ten_keyed_by_exactly_the_ids_sent():
    def script(request):
        ids = request.output.json_schema["required"]
        return json.dumps(
            {
                i: {"evidence": "q", "label": ["full", "partial", "none"][k % 3]}
                for k, i in enumerate(ids)
            }
        )

    engine = ScriptedEngine(script)
    labels = asyncio.run(judge.judge(engine, "answer", nuggets(23), "en", SAMPLING))
    sent = [r.output.json_schema["required"] for r in engine.requests]
    assert sorted(len(s) for s in sent) == [3, 10, 10]
    assert sorted(i for s in sent for i in s) == sorted(f"n{i}" for i in range(23))
    assert set(labels) == {f"n{i}" for i in range(23)}
    for r in engine.requests:
        schema = r.output.json_schema
        assert set(schema["properties"]) == set(schema["required"])
        assert schema["additionalProperties"] is False
        assert r.sampling.temperature == 0.0 and r.sampling.seed == 0
    weights = {n.id: n.weight for n in nuggets(23)}
    score = restore_score({k: v.label for k, v in labels.items()}, weights)  # type: ignore[misc]
    expected = (
        100
        * sum(weights[k] * LABEL_SCORE[v.label] for k, v in labels.items())
        / sum(weights.values())
    )
    assert score == pytest.approx(expected)


def test_judge_rejects_a_missing_or_invented_id():
    engine = ScriptedEngine(
        lambda r: json.dumps(
            {"n0": {"evidence": "", "label": "full"}, "n9": {"evidence": "", "label": "none"}}
        )
    )
    with pytest.raises(ConstrainedOutputError):
        asyncio.run(judge.judge(engine, "a", nuggets(2), "en", SAMPLING))


def test_all_at_once_schema_fixes_the_number_of_questions():
    schema = clarifier.questions_schema(2, allow_stop=False)["properties"]["questions"]
    assert (schema["minItems"], schema["maxItems"]) == (2, 2)
    schema = clarifier.questions_schema(3, allow_stop=True)["properties"]["questions"]
    assert (schema["minItems"], schema["maxItems"]) == (0, 3)


@pytest.mark.slow
def test_options_on_the_tiny_model(tiny_engine):
    """All-at-once clarifier, abstractive answerer and the LLM question-type classifier give
    valid constrained answers on the real tiny model."""
    (instance,) = load_instances(DatasetSource(path="sample", split="dev", limit=1))
    sampling = Sampling(max_tokens=96, seed=0)

    async def go():
        questions = await clarifier.ask_all(
            tiny_engine, instance.blurred_query, 2, instance.language, sampling
        )
        answers = [
            await user_answerer.answer(
                tiny_engine, instance.fused_query, q, instance.language, sampling, "abstractive"
            )
            for q in questions
        ]
        kinds = [
            await classify_with_model(tiny_engine, q, instance.language, Sampling(max_tokens=48))
            for q in questions
        ]
        return questions, answers, kinds

    questions, answers, kinds = asyncio.run(go())
    assert len(questions) == 2 and all(3 <= len(q) <= 200 for q in questions)
    assert all(1 <= len(a) <= 120 for a in answers)
    assert all(k and set(k) <= set(QUESTION_TYPES) for k in kinds)
