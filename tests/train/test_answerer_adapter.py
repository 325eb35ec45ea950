"""The tiny User Answerer's training data (cts/train/answerer_data.py), its fit command (`cts train
answerer`, cts/train/answerer_fit.py on the fit it shares with the judge, cts/train/lora_sft.py) and
its model config (cts/configs/models/smollm2-135m-answerer.yaml)."""

from __future__ import annotations

import asyncio
import builtins
import io
import json
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cts.agents import user_answerer
from cts.agents.prompts import render
from cts.agents.types import UNKNOWN
from cts.cli import app
from cts.configs import CONFIG_DIR
from cts.eval.audit.answerer_calibration import SAMPLE_ANSWERER_LABELS, read_answer_labels
from cts.eval.audit.judge_labels import labels_path
from cts.serving.model_config import load_model_config
from cts.train import answerer_data, answerer_fit, judge_fit, lora_sft, rewriter_fit, searcher_fit
from cts.train.answerer_data import (
    UNKNOWN_QUESTIONS,
    VALUE_QUESTIONS,
    check_completion,
    constraints,
    generate,
    label_counts,
    read_instances,
    unknown_topics,
)
from cts.train.answerer_fit import AnswererFitSettings
from cts.train.judge_fit import JudgeFitSettings
from cts.train.rewriter_fit import RewriterFitSettings
from cts.train.searcher_fit import SearcherFitSettings
from cts.train.sft import sft_row, write_examples
from tests.builders import assert_seeded, shipped_adapter

ANSWERER_CONFIG = CONFIG_DIR / "models" / "smollm2-135m-answerer.yaml"
runner = CliRunner()


def test_the_generator_is_deterministic_and_its_seed_matters():
    assert_seeded(generate, 80)


def test_the_removed_spans_of_the_train_split():
    """Found by diffing fused and blurred query (words; characters in Chinese), trimmed to
    what a careful user would copy."""
    spans = {i.id: [(c.type, c.span) for c in i.constraints] for i in read_instances()}
    assert len(spans) == 24 and all(spans.values())
    assert spans["A-train-01"] == [("time", "2023")]
    assert spans["A-train-02"] == [("time", "Easter 2025")]
    assert spans["A-train-03"] == [("numeric", "23 kg"), ("scope", "domestic flights")]
    assert spans["A-train-05"] == [("entity", "Harnell Coachways")]
    assert spans["B-train-05"] == [("time", "2024"), ("numeric", "over 65")]
    assert spans["C-train-04"] == [("other", "audiobook")]
    assert spans["C-train-05"] == [("entity", "Maude Tennyck's"), ("numeric", "20 cm")]
    assert spans["D-train-04"] == [("definition", "crop lodging in cereals")]
    assert spans["B-train-06"] == [("definition", "老年人居家适老化改造")]
    assert spans["D-train-06"] == [("entity", "澄穗优218")]


def test_a_span_the_dataset_gives_is_taken_as_given():
    fused, blurred = "Cheap flights from Oslo in May 2024", "Cheap flights from Oslo"
    given = constraints(fused, blurred, ["time"], ["May 2024"], "en")
    assert [(c.type, c.span) for c in given] == [("time", "May 2024")]
    assert constraints(fused, blurred, ["time"], [], "en")[0].span == "May 2024"


def test_every_completion_is_what_the_span_constraint_admits():
    """A value: a span of the fused query within the default limits (so the regex the role
    decodes under admits it), absent from the blurred query; `unknown`: only where the
    fused query does not say it. In the role's own prompt."""
    instances = {i.id: i for i in read_instances()}
    for example in generate(400, seed=1):
        check_completion(example)
        instance = instances[example.instance_id]
        assert user_answerer.is_span(example.completion, instance.fused_query)
        system, user = example.messages
        expected = render(
            "user_answerer", example.language, fused_query=instance.fused_query, question="q"
        )[0]
        assert system == {"role": "system", "content": expected.content}
        assert user == {"role": "user", "content": example.question}
        if example.completion == UNKNOWN:
            assert example.topic in unknown_topics(instance)
            assert example.topic not in {c.type for c in instance.constraints}
        else:
            assert example.completion in instance.fused_query
            assert example.completion not in instance.blurred_query
            spans = {c.type: c.span for c in instance.constraints}
            assert spans[example.topic] == example.completion
        assert sft_row(example)["completion"] == [
            {"role": "assistant", "content": example.completion}
        ]


def test_no_unknown_where_the_fused_query_says_it():
    by_id = {i.id: i for i in read_instances()}
    # A year is stated: no time question is answered `unknown`; a place is (has_region).
    assert "time" not in unknown_topics(by_id["C-train-02"])
    assert "region" not in unknown_topics(by_id["A-train-02"])
    assert "numeric" not in unknown_topics(by_id["A-train-03"])
    assert "region" in unknown_topics(by_id["A-train-01"])


def test_labels_topics_and_both_languages():
    examples = generate(400, seed=0)
    counts = label_counts(examples)
    assert sum(counts.values()) == 400
    assert 0.45 <= counts["value"] / 400 <= 0.75, counts
    removed = {c.type for i in read_instances() for c in i.constraints}
    assert {e.topic for e in examples if e.label == "value"} == removed
    asked_unknown = {e.topic for e in examples if e.label == "unknown"}
    assert {"time", "region", "numeric"} <= asked_unknown and len(asked_unknown) >= 6
    chinese = [e for e in examples if e.language == "zh"]
    assert 0.15 <= len(chinese) / 400 <= 0.35
    assert {e.label for e in chinese} == {"value", "unknown"}
    assert all(any("\u4e00" <= c <= "\u9fff" for c in e.question) for e in chinese)
    english = [e for e in examples if e.language == "en"]
    assert all(e.question.isascii() for e in english)
    assert len({e.question for e in examples}) >= 60  # varied phrasings


def test_every_topic_has_phrasings_in_both_languages():
    for table in (VALUE_QUESTIONS, UNKNOWN_QUESTIONS):
        for topic, phrasings in table.items():
            assert set(phrasings) == {"en", "zh"} and all(phrasings.values()), topic


def _opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path opened from here on (builtins.open, io.open, os.open)."""
    seen: list[str] = []

    def recording(original: Any) -> Any:
        def wrapper(file: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, (str, bytes, os.PathLike)):
                seen.append(os.fsdecode(file))
            return original(file, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(builtins, "open", recording(builtins.open))
    monkeypatch.setattr(io, "open", recording(io.open))
    monkeypatch.setattr(os, "open", recording(os.open))
    return seen


def test_the_held_out_answerer_labels_are_never_read(monkeypatch, tmp_path):
    """Generating (and writing) the examples opens the train split only: not the labels
    `cts answerer calibrate --labels sample` measures on, nor their notes, nor any other
    split."""
    opened = _opened(monkeypatch)
    examples = generate(200, seed=0)
    write_examples(examples, tmp_path / "rows.jsonl")
    monkeypatch.undo()
    read = {Path(p).resolve() for p in opened}
    assert answerer_data.TRAIN_FILE.resolve() in read
    sample = answerer_data.TRAIN_FILE.parent.resolve()
    assert {p for p in read if p.parent == sample} == {answerer_data.TRAIN_FILE.resolve()}
    assert SAMPLE_ANSWERER_LABELS.resolve() not in read
    # No fused query of a held-out row on another split's instance is in the data. (Rows on
    # train instances ask about the very fused queries the examples are made from: their
    # figures measure a fine-tuned answerer on seen queries. Counts only, so that a failure
    # prints nothing of the held-out rows.)
    held_out = read_answer_labels("sample").items
    prompts = "\n".join(e.messages[0]["content"] for e in examples)
    other_splits = [r for r in held_out if "-train-" not in r.id]
    assert len(other_splits) > 0
    assert sum(r.fused_query in prompts for r in other_splits) == 0
    assert all("-train-" in e.instance_id for e in examples)
    assert labels_path("sample").parent.resolve() == sample


@pytest.mark.parametrize(
    ("role", "settings", "adapter"),
    [
        ("answerer", AnswererFitSettings(examples=24, seed=5, epochs=1.5), answerer_fit.ADAPTER),
        ("judge", JudgeFitSettings(examples=12, seed=2, learning_rate=2e-4), judge_fit.ADAPTER),
        ("answerer", AnswererFitSettings(examples=16, max_steps=3), answerer_fit.ADAPTER),
        ("rewriter", RewriterFitSettings(examples=16, seed=4, max_steps=2), rewriter_fit.ADAPTER),
        ("searcher", SearcherFitSettings(examples=8, seed=2, epochs=1.5), searcher_fit.ADAPTER),
    ],
)
def test_the_rebuild_command_round_trips(monkeypatch, tmp_path, role, settings, adapter):
    """The command a record names, run, trains with the settings it was made from; the
    record's data is what the role counts."""
    got: dict[str, Any] = {}

    def fake_fit(name, fit_settings, rows, data, output, record_name):
        got.update(name=name, settings=fit_settings, rows=rows, data=data, record=record_name)
        return {"steps": 1, "seconds": 0.0, "train_loss": 0.0}

    monkeypatch.setattr(lora_sft, "fit_lora_sft", fake_fit)
    command = adapter.rebuild_command(settings)
    assert command.startswith(f"cts train {role} ")
    result = runner.invoke(app, [*command.split()[1:], "--output", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert got["name"] == role and got["settings"] == settings
    assert asdict(got["settings"]) == asdict(settings)
    assert len(got["rows"]) == settings.examples
    assert got["record"] == f"{role}_train.json"
    assert next(iter(got["data"])) == "labels" and "languages" in got["data"]


def test_the_answerer_settings_share_the_judge_fit_and_keep_its_defaults():
    judge = asdict(JudgeFitSettings())
    answerer = asdict(AnswererFitSettings())
    assert list(judge) == list(answerer)  # one settings type, one record format
    assert answerer["threads"] == 1 and answerer["batch_size"] * answerer["grad_accum"] == 8
    steps = answerer["examples"] * answerer["epochs"] / 8
    assert steps <= 150  # ≤ 30 min at the ≤ 12 s a step measured (cts/train/answerer_fit.py)


def test_write_data_writes_the_rows_without_training(tmp_path):
    path = tmp_path / "rows.jsonl"
    args = ["train", "answerer", "--examples", "30", "--write-data", str(path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    assert len(rows) == 30 and {r["label"] for r in rows} == {"value", "unknown"}
    assert all(set(r) == {"prompt", "completion", "instance_id", "label", "topic"} for r in rows)
    assert "30 examples" in result.output


def test_the_answerer_config_names_the_adapter_the_fit_writes():
    config = load_model_config(ANSWERER_CONFIG)
    assert config.engine == "transformers" and config.path == "tiny:smollm2-135m-instruct"
    record = shipped_adapter(config, answerer_fit.ADAPTER.adapter_dir, "answerer_train.json")
    assert record["steps"] == 140


@pytest.mark.slow
def test_a_one_step_fit_writes_an_adapter_the_answerer_runs_under_its_constraint(tmp_path):
    """Two examples, one step (about a minute on 2 cores): the adapter and its record are
    written, and the User Answerer with it answers a train question with a span or
    `unknown`."""
    from cts.serving.model_config import build_engine
    from cts.serving.types import Sampling

    settings = replace(AnswererFitSettings(), examples=2, max_steps=1)
    record = answerer_fit.ADAPTER.fit(settings, tmp_path)
    assert record["steps"] == 1 and record["command"].endswith("--max-steps 1")
    written = json.loads((tmp_path / "answerer_train.json").read_text())
    assert written["settings"] == asdict(settings) and sum(written["labels"].values()) == 2
    config = load_model_config(ANSWERER_CONFIG).model_copy(update={"adapter": str(tmp_path)})
    engine = build_engine(config)
    instance = next(i for i in read_instances() if i.id == "A-train-01")
    sampling = user_answerer.SAMPLING.apply(Sampling())
    answer = asyncio.run(
        user_answerer.answer(
            engine, instance.fused_query, "Which year are you asking about?", "en", sampling
        )
    )
    assert user_answerer.is_span(answer, instance.fused_query)


@pytest.mark.slow
def test_the_quickstart_answerer_stays_above_the_floors_of_its_one_measurement(tmp_path):
    """`cts answerer calibrate` on the quickstart (whose User Answerer is the shipped adapter)
    against the shipped labels (about a minute): floors under the figures measured once when
    the adapter was built (exact 56.5%, false answer 32.8%, base 10.6% and 100%) — a
    regression guard, not a tuned number."""
    out = tmp_path / "answerer.json"
    result = CliRunner().invoke(app, ["answerer", "calibrate", "--out", str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())["figures"]
    print(json.dumps(figures))
    assert figures["n"] == 170
    assert figures["exact"]["share"] >= 0.45
    assert figures["false_answer"]["share"] <= 0.5


def test_every_role_adapter_has_its_command_its_model_config_and_its_shipped_adapter():
    """One list of role adapters: each is a `cts train ROLE` command whose --output defaults to
    the folder its model config serves, where the shipped adapter and its record lie."""
    from cts.train.adapters import ROLE_ADAPTERS

    roles = ["judge", "answerer", "searcher", "rewriter", "fuser", "blurrer"]
    assert [a.role for a in ROLE_ADAPTERS] == roles
    for adapter in ROLE_ADAPTERS:
        config = load_model_config(CONFIG_DIR / "models" / f"{adapter.model}.yaml")
        assert CONFIG_DIR / config.adapter == adapter.adapter_dir
        assert (adapter.adapter_dir / adapter.record).is_file()
        shown = runner.invoke(app, ["train", adapter.role, "--help"], terminal_width=200)
        assert shown.exit_code == 0 and f"{adapter.adapter_dir.name}" in shown.output
