"""The tiny Rewriter's training data (cts/train/rewriter_data.py), its fit command (`cts train
rewriter`, cts/train/rewriter_fit.py) and its model config
(cts/configs/models/smollm2-135m-rewriter.yaml)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cts.agents.prompts import render
from cts.agents.types import QA, UNKNOWN, history_text
from cts.configs import CONFIG_DIR
from cts.serving.model_config import load_model_config
from cts.train import rewriter_fit
from cts.train.answerer_data import read_instances
from cts.train.rewriter_data import check_completion, generate, label_counts, with_answers
from tests.builders import assert_seeded, shipped_adapter

REWRITER_CONFIG = CONFIG_DIR / "models" / "smollm2-135m-rewriter.yaml"
runner = CliRunner()


def test_the_generator_is_deterministic_and_its_seed_matters():
    assert_seeded(generate, 40)


def test_the_answers_are_appended_once_in_order_and_unknown_leaves_the_query_alone():
    blurred = "Which smartphones did Nyvra launch, and what were their starting prices?"
    assert with_answers(blurred, [], "en") == blurred
    assert with_answers(blurred, ["2023", "Europe", "2023"], "en") == (
        "Which smartphones did Nyvra launch, and what were their starting prices, 2023, Europe?"
    )
    assert with_answers(blurred, ["Nyvra"], "en") == blurred  # already said
    assert with_answers("澄穗优水稻品种的亩产怎么样？", ["2024年", "湖南"], "zh") == (
        "澄穗优水稻品种的亩产怎么样（2024年，湖南）？"
    )


def test_every_completion_is_the_blurred_query_with_the_dialogues_values():
    """In the role's own prompt; the completion is what the role's schema admits and holds
    exactly the answers that are not `unknown` (each a span of the fused query)."""
    instances = {i.id: i for i in read_instances()}
    examples = generate(300, seed=1)
    for example in examples:
        check_completion(example)
        instance = instances[example.instance_id]
        lines = example.messages[1]["content"].splitlines()
        asked = [line.split(": ", 1)[1] for line in lines if line[:1] in "Q问"]
        given = [line.split(": ", 1)[1] for line in lines if line[:1] in "A答"]
        pairs = [QA(question=q, answer=a) for q, a in zip(asked, given, strict=True)]
        answers = [a for a in given if a != UNKNOWN]
        assert 1 <= len(pairs) <= 3 and len(answers) == example.values
        assert all(a in instance.fused_query for a in answers)
        query = json.loads(example.completion)["query"]
        assert query == with_answers(instance.blurred_query, answers, instance.language)
        system, rendered = render(
            "rewriter",
            instance.language,
            blurred_query=instance.blurred_query,
            history=history_text(pairs, instance.language),
        )
        assert example.messages == [
            {"role": "system", "content": system.content},
            {"role": "user", "content": rendered.content},
        ]
    assert label_counts(examples)["unknown"] >= 30 and label_counts(examples)["values"] >= 150
    assert {e.language for e in examples} == {"en", "zh"}
    assert all("-train-" in e.instance_id for e in examples)


def test_the_rewriter_config_names_the_adapter_the_fit_writes():
    config = load_model_config(REWRITER_CONFIG)
    assert config.path == "tiny:smollm2-135m-instruct"
    record = shipped_adapter(config, rewriter_fit.ADAPTER.adapter_dir, "rewriter_train.json")
    assert record["command"].startswith("cts train rewriter ")
