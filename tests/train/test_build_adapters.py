"""The tiny Fuser's and Blurrer's training data (cts/train/fuser_data.py,
cts/train/blurrer_data.py), their fits (`cts train fuser`, `cts train blurrer`) and model
configs."""

from __future__ import annotations

import json

import pytest

from cts.agents.fuser import StatedConstraint, raw_list
from cts.agents.prompts import render
from cts.configs import CONFIG_DIR
from cts.serving.model_config import load_model_config
from cts.train import blurrer_data, blurrer_fit, fuser_data, fuser_fit
from cts.train.answerer_data import read_instances
from tests.builders import assert_seeded, shipped_adapter


@pytest.mark.parametrize("generate", [fuser_data.generate, blurrer_data.generate])
def test_the_generators_are_deterministic_and_their_seed_matters(generate):
    assert_seeded(generate, 40)


def test_the_rules_find_times_and_figures_with_their_units_and_not_a_year_as_a_figure():
    spans = fuser_data.stated_spans("Engineering works Caldmoor line Easter 2025 23 kg bags?")
    assert spans == [
        StatedConstraint(type="time", span="Easter 2025"),
        StatedConstraint(type="numeric", span="23 kg"),
    ]
    assert fuser_data.stated_spans("2024年售价2000元以下的扫地机器人") == [
        StatedConstraint(type="time", span="2024年"),
        StatedConstraint(type="numeric", span="2000元"),
    ]
    assert fuser_data.stated_spans("3 months of 2023") == [
        StatedConstraint(type="time", span="2023")
    ]


def test_the_fused_query_is_the_most_complete_query_tidied():
    session = ["skyrell air baggage fees", "skyrell air 23 kg bag fees domestic", "bag fees"]
    assert fuser_data.most_complete(session) == session[1]
    assert fuser_data.tidy(session[1], "en") == "Skyrell air 23 kg bag fees domestic?"
    assert fuser_data.tidy("溪川 公租房 2025 ", "zh") == "溪川 公租房 2025？"
    assert fuser_data.most_complete(["a b", "c d"]) == "c d"  # the last on a tie


def test_every_fuser_completion_copies_the_sessions_most_complete_query():
    """In the role's own prompt; every span is in the query, the removed constraint's among
    them where the query holds it."""
    instances = {i.id: i for i in read_instances()}
    examples = fuser_data.generate(200, seed=1)
    for example in examples:
        fuser_data.check_completion(example)
        completion = json.loads(example.completion)
        assert completion["query"] == fuser_data.tidy(
            fuser_data.most_complete(example.session), example.language
        )
        spans = {c["span"] for c in completion["constraints"]}
        removed = instances[example.instance_id].constraints
        assert {c.span for c in removed if c.span in completion["query"]} <= spans
        system, user = render("fuser", example.language, queries=raw_list(example.session))
        assert [m["content"] for m in example.messages] == [system.content, user.content]
    counts = fuser_data.label_counts(examples)
    assert counts["keywords"] > counts["question"] >= 30
    assert {e.language for e in examples} == {"en", "zh"}
    assert fuser_data.constraint_counts(examples)["time"] >= 40


def test_blurring_by_rule_takes_the_function_word_that_served_the_span():
    blur = blurrer_data.blur_by_rule
    assert blur("Which phones did Nyvra launch in 2023, and at what prices?", ["2023"]) == (
        "Which phones did Nyvra launch, and at what prices?"
    )
    assert blur("Engineering works Caldmoor line Easter 2025?", ["Easter 2025"]) == (
        "Engineering works Caldmoor line?"
    )
    edition = "What did the 2024 edition recommend?"
    assert blur(edition, ["2024"]) == "What did the edition recommend?"
    assert blur("溪川市在2025年公租房的收入标准？", ["2025年"]) == "溪川市公租房的收入标准？"


def test_every_blurrer_completion_passes_the_checks_cts_data_blur_applies():
    instances = {i.id: i for i in read_instances()}
    examples = blurrer_data.generate(200, seed=1)
    for example in examples:
        blurrer_data.check_completion(example)  # span gone, a question, nothing dangling
        instance = instances[example.instance_id]
        completion = json.loads(example.completion)
        if example.label == "dataset":
            assert example.fused_query == instance.fused_query
            assert completion["blurred_query"] == instance.blurred_query
        else:
            spans = [c["span"] for c in completion["removed"]]
            assert completion["blurred_query"] == blurrer_data.blur_by_rule(
                example.fused_query, spans
            )
    counts = blurrer_data.label_counts(examples)
    assert counts["rule"] > counts["dataset"] >= 30
    assert {e.language for e in examples} == {"en", "zh"}
    assert len(blurrer_data.removed_counts(examples)) >= 5


@pytest.mark.parametrize(
    ("name", "adapter", "record"),
    [
        ("smollm2-135m-fuser", fuser_fit.ADAPTER, "fuser_train.json"),
        ("smollm2-135m-blurrer", blurrer_fit.ADAPTER, "blurrer_train.json"),
    ],
)
def test_the_build_configs_name_the_adapters_the_fits_write(name, adapter, record):
    config = load_model_config(CONFIG_DIR / "models" / f"{name}.yaml")
    assert config.path == "tiny:smollm2-135m-instruct"
    found = shipped_adapter(config, adapter.adapter_dir, record)
    assert found["command"].startswith(f"cts train {adapter.role} ")
