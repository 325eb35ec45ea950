"""The tiny judge's training data (cts/train/judge_data.py) and its shipped LoRA adapter
(cts/configs/models/smollm2-135m-judge.yaml)."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass

import pytest

from cts.agents import judge
from cts.configs import CONFIG_DIR
from cts.eval.audit.judge_labels import read_labels
from cts.foundation.yaml_config import ConfigError
from cts.serving.model_config import ModelConfig, build_engine, load_model_config
from cts.serving.types import Sampling
from cts.train import judge_data
from cts.train.judge_data import (
    changed_numbers,
    check_schema,
    first_part,
    generate,
    label_counts,
    read_instances,
    rounded_number,
)
from tests.builders import assert_seeded

JUDGE_CONFIG = CONFIG_DIR / "models" / "smollm2-135m-judge.yaml"


def test_the_generator_is_deterministic_and_its_seed_matters():
    assert_seeded(generate, 60)


def test_the_labels_are_balanced_and_both_languages_present():
    examples = generate(300, seed=0)
    counts = label_counts(examples)
    total = sum(counts.values())
    for label in judge.LABELS:
        assert counts[label] / total >= 0.15, counts
    assert {e.language for e in examples} == {"en", "zh"}
    kinds = {k for e in examples for k in e.kinds.values()}
    assert kinds == set(judge_data.KINDS)


def test_every_completion_fits_the_judge_schema_in_the_judge_prompt():
    for example in generate(100, seed=1):
        check_schema(example)
        system, user = example.messages
        template = "You judge whether" if example.language == "en" else "你判断一个回答"
        assert system["role"] == "system" and system["content"].startswith(template)
        assert list(json.loads(example.completion)) == list(example.labels)
        listed = [line.split(":")[0] for line in user["content"].splitlines() if line[:1] == "n"]
        assert listed == list(example.labels)


def test_only_the_train_split_is_used():
    """No instance, nugget or answer of the held-out human labels is read: examples come from
    train.jsonl's instances only."""
    train_ids = {i.id for i in read_instances()}
    assert all(i.endswith(tuple(f"-train-{n:02d}" for n in range(1, 25))) for i in train_ids)
    assert {e.instance_id for e in generate(200, seed=0)} <= train_ids
    held_out = {a.answer for a in read_labels("sample").answers}
    assert not any(a in e.messages[1]["content"] for e in generate(200, seed=0) for a in held_out)


def test_near_misses_partial_statements_and_rounding():
    rng = random.Random(0)
    nugget = "The Sol 5 launched in February 2023 at a starting price of €449."
    changed = changed_numbers(nugget, rng)
    assert changed is not None and "2023" not in changed and "449" not in changed
    assert first_part(nugget, "en") == "The Sol 5 launched in February 2023."
    assert rounded_number(nugget, "en") == (
        "The Sol 5 launched in February 2023 at a starting price of about €450."
    )
    assert rounded_number("一般家庭适老化改造每户补贴最高8000元。", "zh") is None
    assert rounded_number("区域试验平均亩产约652公斤。", "zh") == "区域试验平均亩产约650公斤。"
    assert rounded_number("It plays for about 7.5 hours.", "en") == "It plays for about 8 hours."
    assert changed_numbers("No figure here.", rng) is None


def test_the_judge_config_names_its_shipped_adapter():
    config = load_model_config(JUDGE_CONFIG)
    adapter = config.resolved_adapter()
    assert adapter is not None and adapter.startswith(str(CONFIG_DIR))
    record = json.loads((CONFIG_DIR / config.adapter / "judge_train.json").read_text())
    assert record["settings"]["examples"] > 0 and record["steps"] > 0


def test_an_adapter_needs_the_transformers_engine_and_an_adapter_dir(tmp_path):
    with pytest.raises(ValueError, match="only the transformers engine"):
        ModelConfig(name="x", path="p", engine="openai", adapter="a")
    config = ModelConfig(name="x", path="p", adapter=str(tmp_path))
    with pytest.raises(ConfigError, match=r"no adapter_config\.json"):
        config.resolved_adapter()
    # An experiment naming it is refused when it loads, before a run directory is made.
    from cts.eval.run.config import load_experiment

    with pytest.raises(ConfigError, match=r"model smollm2-135m-searcher: adapter .* no adapter_c"):
        load_experiment(None, [f"models.smollm2-135m-searcher.adapter={tmp_path}"])


def test_the_adapter_is_part_of_the_engine_identity(tiny_path):
    from cts.serving.transformers_engine import TransformersEngine

    config = load_model_config(JUDGE_CONFIG)
    base = TransformersEngine("m", tiny_path)
    tuned = TransformersEngine("m", tiny_path, adapter=config.resolved_adapter())
    assert tuned.identity.startswith(base.identity + "+lora:")


@dataclass(frozen=True)
class _Nugget:
    id: str
    text: str


def _train_instance(name: str) -> judge_data.Instance:
    return next(i for i in read_instances() if i.id == name)


def _labels(answer: str, instance: judge_data.Instance) -> dict[str, str]:
    engine = build_engine(load_model_config(JUDGE_CONFIG))
    nuggets = [_Nugget(i, t) for i, t in instance.nuggets]
    sampling = judge.SAMPLING.apply(Sampling())
    got = asyncio.run(judge.judge(engine, answer, nuggets, instance.language, sampling))
    assert list(got) == [n.id for n in nuggets]  # schema-valid: every id, nothing else
    assert {v.label for v in got.values()} <= set(judge.LABELS)
    return {i: v.label for i, v in got.items()}


@pytest.mark.slow
def test_the_shipped_adapter_loads_through_its_config_and_judges_in_the_schema():
    """A Chinese train instance: every nugget id gets one of the three labels (`_labels`
    checks the schema's keys and labels)."""
    instance = _train_instance("D-train-06")
    _labels(instance.nuggets[1][1], instance)


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="the shipped adapter (150 steps on 600 generated examples) labels A-train-01's "
    "stated n1 and n3 `none` (measured 2026-12-03); κ −0.030 on the sample labels",
)
def test_the_shipped_judge_tells_a_stated_answer_from_an_unrelated_one():
    """On a train-split instance: an answer stating its nuggets' facts gets `full` for them, an
    unrelated answer `none` throughout."""
    instance = _train_instance("A-train-01")
    stated = " ".join(t for _, t in instance.nuggets[:3])
    labels = _labels(stated, instance)
    assert [labels[i] for i, _ in instance.nuggets[:3]] == ["full"] * 3, labels
    unrelated = _labels(judge.UNRELATED_ANSWERS["en"], instance)
    assert set(unrelated.values()) == {"none"}, unrelated


def test_the_kappa_ci_resamples_answers_and_holds_the_estimate():
    from cts.eval.audit.agreement import cohen_kappa
    from cts.eval.audit.calibration import kappa_ci

    perfect = [[("full", "full"), ("none", "none")], [("partial", "partial"), ("none", "none")]]
    assert kappa_ci(perfect) == (1.0, 1.0)
    rng = random.Random(0)
    answers = [
        [(rng.choice(judge.LABELS), rng.choice(judge.LABELS)) for _ in range(5)] for _ in range(20)
    ]
    low, high = kappa_ci(answers) or (0.0, 0.0)
    estimate = cohen_kappa([p for a in answers for p in a], judge.LABELS).kappa
    assert estimate is not None and low <= estimate <= high and low < high
    assert kappa_ci(answers[:1]) is None
