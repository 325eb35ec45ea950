"""Clarifier fine-tuning (cts/train/): pairs from hand-made records, config errors, and the whole
`cts train` pipeline on the tiny real model."""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

import cts.eval.experiment as experiment_module
import cts.train.loop_runner as loop_runner_module
from cts.agents import clarifier
from cts.agents.clarifier import ClarifyingQuestion
from cts.agents.types import QA
from cts.cli import app
from cts.configs import CONFIG_DIR
from cts.eval.data.dataset import SAMPLE_DIR
from cts.eval.data.schema import Instance, Record
from cts.eval.report.summary import Comparison
from cts.eval.run.config import load_experiment
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import RunDir, Shard
from cts.foundation.yaml_config import ConfigError
from cts.serving.model_config import ModelConfig, load_model_config
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import Sampling
from cts.train.config import RewardSettings, TrainConfig, load_train_config
from cts.train.fit import fine_tuned_config
from cts.train.loop import (
    LoopError,
    _delta,
    _spent,
    evaluation,
    iterations,
    loop_step,
    loop_steps,
    variants,
)
from cts.train.pairs import (
    candidate_row,
    collect,
    dpo_pairs,
    dpo_row,
    normalise,
    prompt_messages,
    read_records,
    sft_examples,
    sft_row,
    stats,
)
from cts.train.sample import sampling_experiment
from tests.builders import cts
from tests.scripted_cts import scripted_engines

runner = CliRunner()

pytestmark = pytest.mark.usefixtures("wide_terminal")


def record_of(
    instance_id: str, seed: int, condition: str, turns: list[tuple[str, str]], **fields: Any
) -> Record:
    """A record of the dialogue `turns` (question, answer), with any other fields given."""
    return Record(
        instance_id=instance_id,
        condition=condition,
        seed=seed,
        questions=[q for q, _ in turns],
        answers=[a for _, a in turns],
        **fields,
    )


def rec(
    instance_id: str,
    seed: int,
    question: str | None,
    score: float | None,
    error: str | None = None,
    condition: str = "clarify@1",
) -> Record:
    """One question, answered `unknown` (None: none asked); `score` as its restore score beside
    a strict 0 (None: no scores); failed with `error` when one is given."""
    turns = [] if question is None else [(question, "unknown")]
    scores = {} if score is None else {"restore_score_100": score, "strict": 0.0}
    failure = {"kind": error, "stage": "search", "message": "boom"} if error else None
    return record_of(instance_id, seed, condition, turns, scores=scores, error=failure)


def hand_made() -> list[Record]:
    return [
        # A: "Which year?" twice (whitespace aside) → one candidate, mean 70 over 2 samples.
        rec("A", 0, "Which year?", 80.0),
        rec("A", 1, "  Which   year?\n", 60.0),
        rec("A", 2, "Which city?", 20.0),
        rec("A", 3, "Which model?", 50.0),
        # B: two questions 5 points apart: below a 10-point margin.
        rec("B", 0, "Which region?", 30.0),
        rec("B", 1, "Which country?", 25.0),
        # C: one distinct question only.
        rec("C", 0, "When?", 40.0),
        rec("C", 1, "When?", 40.0),
        # D: every question scored the same.
        rec("D", 0, "Which one?", 0.0),
        rec("D", 1, "Which brand?", 0.0),
        # Unusable, each for its own reason.
        rec("A", 4, "Which month?", None, error="search_error"),
        rec("A", 5, "Which day?", None, error="timeout"),
        rec("B", 2, "Which town?", None),
        rec("B", 3, None, 10.0),
        rec("B", 0, "Which region?", 90.0, condition="blurred"),
        rec("Z", 0, "Which planet?", 99.0),
    ]


KNOWN = {"A", "B", "C", "D"}


def test_collect_dedupes_questions_and_counts_skipped_records():
    collected = collect(hand_made(), KNOWN)
    assert collected.used == 10
    assert dict(collected.skipped) == {
        "error:search_error": 1,
        "error:timeout": 1,
        "no_scores": 1,
        "no_question": 1,
        "other_condition": 1,
        "unknown_instance": 1,
    }
    a = {c.question: c for c in collected.candidates["A"]}
    assert list(a) == ["Which year?", "Which city?", "Which model?"]  # order of first seed
    assert a["Which year?"].score == 70.0 and a["Which year?"].seeds == (0, 1)
    assert [c.question for c in collected.candidates["C"]] == ["When?"]


def test_dpo_best_against_worst_only_beyond_the_margin():
    collected = collect(hand_made(), KNOWN)
    pairs = dpo_pairs(collected.candidates, min_margin=10.0)
    assert [(p.instance_id, p.chosen.question, p.rejected.question, p.margin) for p in pairs] == [
        ("A", "Which year?", "Which city?", 50.0)
    ]
    # B's 5 points count once the margin allows them; ties (D) never make a pair.
    loose = dpo_pairs(collected.candidates, min_margin=0.0)
    assert [(p.instance_id, p.margin) for p in loose] == [("A", 50.0), ("B", 5.0)]


def test_dpo_best_against_every_other_question():
    collected = collect(hand_made(), KNOWN)
    pairs = dpo_pairs(collected.candidates, min_margin=10.0, pairing="best_vs_rest")
    assert [(p.chosen.question, p.rejected.question, p.margin) for p in pairs] == [
        ("Which year?", "Which city?", 50.0),
        ("Which year?", "Which model?", 20.0),
    ]


def test_ties_prefer_the_steadier_mean_then_the_first_seed():
    collected = collect(
        [rec("A", 0, "One?", 50.0), rec("A", 1, "Two?", 50.0), rec("A", 2, "Two?", 50.0)]
    )
    (example,) = sft_examples(collected.candidates)
    assert example.best.question == "Two?"
    collected = collect([rec("A", 3, "Later?", 50.0), rec("A", 1, "Earlier?", 50.0)])
    (example,) = sft_examples(collected.candidates)
    assert example.best.question == "Earlier?"


def tied_candidates() -> list[tuple[list[Record], RewardSettings, float]]:
    """Two actions of one instance whose rewards are equal in exact arithmetic, not in floats:
    records, reward settings and the reward by hand. "Which year?" (seeds 0, 1) scores 0 and
    100, mean 50, "Which city?" (seed 2) 50; blurred 100/3 and 200/7: baseline 650/21, each
    reward 50 − 650/21 = 400/21 (as a mean of per-dialogue rewards, the floats differ by
    3.6e-15). Then, without a baseline, 100·5/12 thrice (seeds 0-2) against 100/3 and 50
    (seeds 3, 4), both 125/3, whose float means differ by 7.1e-15, the one sampled less
    above."""
    return [
        (
            [
                rec("A", 0, None, 100 / 3, condition="blurred"),
                rec("A", 1, None, 100 * 2 / 7, condition="blurred"),
                rec("A", 0, "Which year?", 0.0),
                rec("A", 1, "Which year?", 100.0),
                rec("A", 2, "Which city?", 50.0),
            ],
            RewardSettings(),
            400 / 21,
        ),
        (
            [
                *(rec("A", seed, "Which year?", 100 * 5 / 12) for seed in range(3)),
                rec("A", 3, "Which city?", 100 / 3),
                rec("A", 4, "Which city?", 50.0),
            ],
            RewardSettings(baseline="none"),
            125 / 3,
        ),
    ]


@pytest.mark.parametrize("case", [0, 1], ids=["mean_of_differences", "float_scores"])
def test_rewards_equal_in_exact_arithmetic_tie(case):
    """A tie is no preference, even with min_margin 0: no pair, every state counted all-equal,
    the SFT pick the action sampled more, and nothing above the state's mean."""
    records, settings, reward = tied_candidates()[case]
    collected = collect(records, None, settings)
    year, city = collected.candidates["A"]
    assert (year.question, city.question) == ("Which year?", "Which city?")
    assert year.samples > city.samples
    assert year.reward == pytest.approx(reward) and city.reward == pytest.approx(reward)
    assert dpo_pairs(collected.candidates, 0.0) == []
    assert dpo_pairs(collected.candidates, 0.0, "best_vs_rest") == []
    (example,) = sft_examples(collected.candidates, min_score=-1.0)
    assert example.best is year
    assert sft_examples(collected.candidates, min_score=-1.0, above_mean=True) == []
    summary = stats(collected, [], "dpo", 0.0)
    assert (summary["all_equal"], summary["below_margin"]) == (1, 0)


def test_a_candidates_reward_is_made_of_its_mean_score_and_costs():
    """The first tied case gives one float for both rewards (its mean score less the baseline),
    and candidates.jsonl's parts add up to the reward: 400/21 = 50 − 650/21 − 0 − 0."""
    records, settings, _ = tied_candidates()[0]
    year, city = collect(records, None, settings).candidates["A"]
    assert year.reward == city.reward
    row = candidate_row("A", year)
    assert row["gain"] == row["score"] - row["baseline"] == year.reward
    priced = collect(records, None, RewardSettings(question_cost=2.0, unknown_cost=5.0))
    row = candidate_row("A", priced.candidates["A"][0])
    assert row["reward"] == row["gain"] - 2.0 - 5.0 == pytest.approx(400 / 21 - 7)


def test_the_worst_and_the_sft_bar_see_ties_too():
    """Rejected: of the two worst, 125/3 both in exact arithmetic ("Low?" once at 100·5/12,
    "Lower?" at 100/3 and 50, a hair above in floats), the one sampled more. SFT: a gain of
    125/3 − 125/3 = 0 over the blurred 100·5/12 is not above sft_min_score 0."""
    collected = collect(
        [
            rec("A", 0, "Top?", 80.0),
            rec("A", 1, "Low?", 100 * 5 / 12),
            rec("A", 2, "Lower?", 100 / 3),
            rec("A", 3, "Lower?", 50.0),
        ]
    )
    (pair,) = dpo_pairs(collected.candidates, 0.0)
    assert (pair.chosen.question, pair.rejected.question) == ("Top?", "Lower?")
    assert pair.margin == pytest.approx(80 - 125 / 3)
    records = [
        rec("A", 0, None, 100 * 5 / 12, condition="blurred"),
        rec("A", 0, "Which?", 100 / 3),
        rec("A", 1, "Which?", 50.0),
    ]
    assert sft_examples(collect(records, None, RewardSettings()).candidates, 0.0) == []


def test_a_margin_of_min_margin_in_exact_arithmetic_makes_a_pair():
    """125/3 − 95/3 is 10 exactly, 9.999999999999996 in floats: at min_margin 10 a pair, not a
    state below the margin."""
    collected = collect([rec("A", 0, "Yes?", 100 * 5 / 12), rec("A", 1, "No?", 95 / 3)])
    (pair,) = dpo_pairs(collected.candidates, 10.0)
    assert (pair.chosen.question, pair.margin) == ("Yes?", pytest.approx(10.0))
    assert stats(collected, [], "dpo", 10.0)["below_margin"] == 0


def test_sft_keeps_the_best_question_above_the_bar():
    collected = collect(hand_made(), KNOWN)
    examples = sft_examples(collected.candidates, min_score=0.0)
    # D scored 0 everywhere: nothing restored, nothing to imitate.
    assert [(e.instance_id, e.best.question, e.best.score) for e in examples] == [
        ("A", "Which year?", 70.0),
        ("B", "Which region?", 30.0),
        ("C", "When?", 40.0),
    ]
    a = examples[0]
    assert a.mean_reward == pytest.approx((80 + 60 + 20 + 50) / 4)
    # Above the mean: C's only question is its mean, so it taught nothing about asking.
    above = sft_examples(collected.candidates, min_score=0.0, above_mean=True)
    assert [e.instance_id for e in above] == ["A", "B"]
    # A bar below 0 keeps every instance (the tiny model's quickstart).
    assert len(sft_examples(collected.candidates, min_score=-1)) == 4


def test_stats_count_why_instances_give_no_pair():
    collected = collect(hand_made(), KNOWN)
    pairs = dpo_pairs(collected.candidates, min_margin=10.0)
    rows = [
        dpo_row(p, Instance(id=p.instance_id, blurred_query="q", fused_query="q x")) for p in pairs
    ]
    summary = stats(collected, rows, "dpo", 10.0)
    assert summary["instances"] == 4
    assert summary["candidates"] == 10
    assert summary["distinct_questions"] == 3 + 2 + 1 + 2
    assert (summary["single_question"], summary["all_equal"], summary["below_margin"]) == (1, 1, 1)
    assert summary["pairs"] == 1 and summary["mean_margin"] == 50.0
    assert summary["skipped"]["error:search_error"] == 1


def sample_instance(instance_id: str) -> Instance:
    for line in (SAMPLE_DIR / "train.jsonl").read_text().splitlines():
        data = json.loads(line)
        if data["id"] == instance_id:
            return Instance.model_validate(data)
    raise KeyError(instance_id)


@pytest.mark.parametrize("instance_id", ["A-train-01", "B-train-06"])
async def test_the_prompt_is_what_clarifier_ask_sends(instance_id):
    instance = sample_instance(instance_id)
    question = "哪一年的补贴标准？" if instance.language == "zh" else "Which year do you mean?"
    engine = ScriptedEngine(lambda request: json.dumps({"question": question}))
    asked = await clarifier.ask(
        engine, instance.blurred_query, [], instance.language, Sampling(temperature=1.0, seed=3)
    )
    assert asked.question == question
    sent = [m.model_dump() for m in engine.requests[0].messages]

    candidates = collect([rec(instance_id, 0, question, 60.0), rec(instance_id, 1, "Hm?", 0.0)])
    (pair,) = dpo_pairs(candidates.candidates, min_margin=10.0)
    row = dpo_row(pair, instance)
    assert row["prompt"] == sent
    assert instance.blurred_query in sent[1]["content"]
    # The completion is what the constrained output gives, non-ASCII kept as is.
    (chosen,) = row["chosen"]
    assert chosen["role"] == "assistant" and question in chosen["content"]
    assert ClarifyingQuestion.model_validate_json(chosen["content"]).question == question
    assert json.loads(row["rejected"][0]["content"]) == {"question": "Hm?"}
    assert (row["chosen_score"], row["rejected_score"], row["margin"]) == (60.0, 0.0, 60.0)

    (example,) = sft_examples(candidates.candidates)
    sft = sft_row(example, instance)
    assert sft["messages"] == [*sent, chosen]
    assert sft["instance_id"] == instance_id and sft["score"] == 60.0


# -- files and the CLI without a model ------------------------------------------------------------


def train_yaml(tmp_path: Path, **extra: object) -> Path:
    doc = {
        "name": "t",
        "experiment": "quickstart",
        "split": "train",
        "candidates": 2,
        "output_dir": str(tmp_path / "out"),
        **extra,
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def write_samples(config_path: Path, records: list[Record]) -> Path:
    """A sampling run's directory as `cts train sample` leaves it, with hand-made records."""
    config = load_train_config(config_path)
    samples = config.samples_dir()
    samples.mkdir(parents=True, exist_ok=True)
    (samples / "config.yaml").write_text(sampling_experiment(config).to_yaml())
    store = RecordStore(samples)
    for record in records:
        store.append(record, Shard())
    return samples


def questions_asked(scored: dict[str, dict[str, float]]) -> list[Record]:
    """`rec`s of the questions sampled on each instance (by its id), each with its score: the
    first under seed 0, the next under seed 1, and so on."""
    return [
        rec(instance_id, seed, question, score)
        for instance_id, questions in scored.items()
        for seed, (question, score) in enumerate(questions.items())
    ]


def test_pairs_command_writes_trl_rows_and_stats(tmp_path):
    config = train_yaml(tmp_path)
    write_samples(
        config,
        [
            *questions_asked(
                {
                    "A-train-01": {"Which year?": 75.0, "Which colour?": 25.0},
                    "A-train-02": {"When?": 0.0, "Where?": 0.0},
                }
            ),
            rec("A-train-03", 0, "Which airline?", None, error="search_error"),
            # The baseline: not asking scored 20 and 40 on A-train-01, 10 on A-train-02.
            rec("A-train-01", 0, None, 20.0, condition="blurred"),
            rec("A-train-01", 1, None, 40.0, condition="blurred"),
            rec("A-train-02", 0, None, 10.0, condition="blurred"),
            rec("A-train-02", 1, None, None, error="timeout", condition="blurred"),
        ],
    )
    result = cts("train", "pairs", "-c", str(config))
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "out" / "pairs.jsonl").read_text().splitlines()
    (row,) = [json.loads(line) for line in lines]
    assert set(row) >= {"instance_id", "prompt", "chosen", "rejected", "margin"}
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["chosen"] == [{"role": "assistant", "content": '{"question": "Which year?"}'}]
    # Rewards are gains over the blurred mean (30 on A-train-01): 45 and −5.
    assert (row["chosen_reward"], row["rejected_reward"], row["margin"]) == (45.0, -5.0, 50.0)
    assert (row["chosen_score"], row["turn"]) == (75.0, 1)
    summary = json.loads((tmp_path / "out" / "pairs_stats.json").read_text())
    assert summary["pairs"] == 1 and summary["all_equal"] == 1
    assert summary["skipped"] == {"blurred:error:timeout": 1, "error:search_error": 1}
    candidates = [json.loads(x) for x in (tmp_path / "out" / "candidates.jsonl").open()]
    assert [(c["question"], c["baseline"], c["gain"], c["reward"]) for c in candidates] == [
        ("Which year?", 30.0, 45.0, 45.0),
        ("Which colour?", 30.0, -5.0, -5.0),
        ("When?", 10.0, -10.0, -10.0),
        ("Where?", 10.0, -10.0, -10.0),
    ]

    sft = cts("train", "pairs", "-c", str(config), "--set", "method=sft")
    assert sft.exit_code == 0, sft.output
    (example,) = [json.loads(x) for x in (tmp_path / "out" / "sft.jsonl").read_text().splitlines()]
    assert example["messages"][-1]["content"] == '{"question": "Which year?"}'


def test_no_pairs_exits_1_and_says_why(tmp_path):
    config = train_yaml(tmp_path, reward={"baseline": "none"})
    write_samples(
        config,
        questions_asked(
            {
                "A-train-01": {"Which year?": 0.0, "Which colour?": 0.0},
                "A-train-02": {"When?": 30.0, "Where?": 25.0},
            }
        ),
    )
    result = runner.invoke(app, ["train", "pairs", "-c", str(config)])
    assert result.exit_code == 1
    assert "1 had all candidates scoring equal" in result.output
    assert "1 differed by less than min_margin=10" in result.output
    assert "min_margin may be too high" in result.output
    # fit on the empty file says the same, before loading any model.
    fit = runner.invoke(app, ["train", "fit", "-c", str(config)])
    assert fit.exit_code == 1 and "min_margin may be too high" in fit.output


def test_unreadable_rows_name_file_and_line(tmp_path):
    config = train_yaml(tmp_path)
    samples = write_samples(config, [rec("A-train-01", 0, "Which year?", 75.0)])
    shard = samples / "records" / "clarify@1" / "shard-0-of-1.jsonl"
    with shard.open("a") as f:
        f.write('{"instance_id": "A-train-01", "seed": "x"}\n')
        f.write('{"instance_id": "A-tr')  # unfinished: a shard still writing
    result = runner.invoke(app, ["train", "pairs", "-c", str(config)])
    assert result.exit_code == 1
    assert f"{shard}:2: condition: Field required" in result.output

    # The unfinished last line alone is skipped and counted, and the file is left as it was.
    shard.write_text(shard.read_text().replace('{"instance_id": "A-train-01", "seed": "x"}\n', ""))
    before = shard.read_bytes()
    records, skipped = read_records(samples)
    assert len(records) == 1 and skipped == {"unfinished_line": 1}
    assert shard.read_bytes() == before

    pairs = tmp_path / "out" / "pairs.jsonl"
    pairs.write_text('{"prompt": [], "chosen": [], "rejected": []}\n{"prompt": []}\n')
    fit = runner.invoke(app, ["train", "fit", "-c", str(config)])
    assert fit.exit_code == 1 and f"{pairs}:2: missing chosen, rejected (dpo row)" in fit.output


def test_pairs_before_sampling_says_what_to_run(tmp_path):
    result = runner.invoke(app, ["train", "pairs", "-c", str(train_yaml(tmp_path))])
    assert result.exit_code == 1 and "run `cts train sample` first" in result.output


# -- config ---------------------------------------------------------------------------------------


def test_config_errors_name_file_line_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncandidates: 1\nlora:\n  rank: 8\nmethod: dpo\n")
    with pytest.raises(ConfigError) as e:
        load_train_config(bad)
    assert str(e.value).splitlines() == [
        f"{bad}:2: candidates: Input should be greater than or equal to 2",
        f"{bad}:4: lora.rank: unknown key",
    ]
    with pytest.raises(ConfigError, match=r"--set method: Input should be 'dpo' or 'sft'"):
        load_train_config(train_yaml(tmp_path), ["method=ppo"])
    result = runner.invoke(app, ["train", "fit", "-c", str(bad)])
    assert result.exit_code == 2 and f"{bad}:2: candidates:" in result.output
    overridden = load_train_config(
        train_yaml(tmp_path, experiment_overrides=["budgets.max_calls=1"])
    )
    with pytest.raises(ConfigError) as e:
        sampling_experiment(overridden)
    assert str(e.value).splitlines() == [
        f"{tmp_path / 'train.yaml'}:2: experiment 'quickstart', as this train config overrides it:",
        # The entry's own line (the 6th line is `experiment_overrides:`).
        f"{tmp_path / 'train.yaml'}:7: experiment_overrides.0 → budgets.max_calls: unknown key",
    ]
    missing = runner.invoke(app, ["train", "sample", "-c", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "train config file not found" in missing.output


def test_sampling_on_the_evaluation_split_is_refused_before_any_run(tmp_path):
    config = train_yaml(tmp_path, split="dev")
    result = runner.invoke(app, ["train", "sample", "-c", str(config)])
    assert result.exit_code == 2
    assert f"{config}:3: split: sampling would read the data experiment 'quickstart'" in (
        result.output
    )
    assert not (tmp_path / "out").exists()
    # null reads dev and test: the evaluation split is among them.
    with pytest.raises(ConfigError, match=r"--set split: .*split\(s\) dev, test"):
        sampling_experiment(load_train_config(config, ["split=null"]))


def test_sample_takes_shard_and_endpoints_as_cts_run_does(tmp_path):
    config = str(train_yaml(tmp_path))
    bad_shard = runner.invoke(app, ["train", "sample", "-c", config, "--shard", "3/2"])
    assert bad_shard.exit_code == 2 and "--shard '3/2': need 0 <= I < N" in bad_shard.output
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps({"models": {"qwen3-8b": {"base_url": "http://h:1/v1"}}}))
    foreign = runner.invoke(app, ["train", "sample", "-c", config, "--endpoints", str(endpoints)])
    assert foreign.exit_code == 2
    assert "endpoints for models this experiment does not use: ['qwen3-8b']" in foreign.output
    assert not (tmp_path / "out").exists()


def test_shipped_train_configs_load_and_derive_the_sampling_experiment():
    quick = load_train_config(None)
    assert quick.name == "quickstart"
    resolved = sampling_experiment(quick)
    experiment = resolved.experiment
    # The tiny quickstart goes without the blurred baseline (its judge scores every run 0).
    assert experiment.conditions == ["clarify@1"]
    assert experiment.seeds == list(range(quick.candidates))
    assert experiment.dataset.split == "train" and experiment.dataset.limit == quick.limit
    assert resolved.sampling_for("clarifier").temperature == quick.temperature
    real = load_train_config("qwen3-8b-dpo")
    assert real.experiment == "hard518" and real.method == "dpo"
    resolved = sampling_experiment(real, check_instances=False)  # its data is not shipped
    assert resolved.model_for("clarifier").name == "Qwen/Qwen3-8B"
    assert len(resolved.experiment.seeds) == real.candidates
    assert resolved.experiment.conditions == ["blurred", "clarify@1"]
    # Its loop's variants swap one simulator each, on hard518's own data.
    base = iterations(real, 1)[0]
    judges = {
        v: evaluation(real, base, v, False).experiment.roles["judge"].model for v in variants(real)
    }
    users = {
        v: evaluation(real, base, v, False).experiment.roles["user_answerer"].model
        for v in variants(real)
    }
    assert judges["other_judge"] != judges["main"] == judges["other_user"]
    assert users["other_user"] != users["main"] == users["other_judge"]


def test_sampling_forces_sequential_dialogues_of_the_configured_turns(tmp_path):
    config = train_yaml(tmp_path, temperature=0.7)
    sampled = sampling_experiment(load_train_config(config))
    assert sampled.sampling_for("clarifier").temperature == 0.7
    experiment = sampled.experiment
    assert experiment.clarification.mode == "sequential"
    assert experiment.clarification.allow_stop is False
    assert experiment.conditions == ["blurred", "clarify@1"]
    deeper = load_train_config(config, ["turns=3", "allow_stop=true", "reward.baseline=none"])
    experiment = sampling_experiment(deeper).experiment
    assert experiment.conditions == ["clarify@3"]
    assert experiment.clarification.allow_stop is True


# -- dialogues: every turn credited by where the dialogues through it ended --------------------


def dialogue(
    instance_id: str,
    seed: int,
    turns: list[tuple[str, str]],
    score: float,
    stop: str | None = None,
    condition: str = "clarify@2",
) -> Record:
    return record_of(
        instance_id,
        seed,
        condition,
        turns,
        stopped_early=stop is not None,
        stop_question=stop or "",
        scores={"restore_score_100": score},
    )


def two_turn_dialogues() -> list[Record]:
    """Four 2-turn dialogues of one instance: three start with "Which year?" (answered 2024,
    or `unknown` once), one with "Which city?"; one stops after its first question."""
    return [
        dialogue("A", 0, [("Which year?", "2024"), ("Which city?", "Oslo")], 90.0),
        dialogue("A", 1, [("Which  year?", "2024"), ("Which model?", "unknown")], 30.0),
        dialogue("A", 2, [("Which year?", "2024")], 60.0, stop="No more questions."),
        dialogue("A", 3, [("Which city?", "Oslo"), ("Which year?", "unknown")], 20.0),
        dialogue("A", 0, [], 10.0, condition="blurred"),
        dialogue("A", 1, [], 30.0, condition="blurred"),
    ]


def test_each_turn_is_credited_with_the_mean_of_the_dialogues_through_it():
    reward = RewardSettings(baseline="blurred", question_cost=5.0, unknown_cost=10.0)
    collected = collect(two_turn_dialogues(), reward=reward, condition="clarify@2")
    assert collected.used == 4 and not collected.skipped
    found = {(c.turn, c.state, c.question, c.stop): c for c in collected.candidates["A"]}
    # By hand: baseline = (10 + 30) / 2 = 20. Rewards: seed 0: 90 − 20 − 2·5 = 60;
    # seed 1: 30 − 20 − 2·5 − 10 = −10; seed 2: 60 − 20 − 5 = 35; seed 3: 20 − 20 − 10 − 10 = −20.
    year = found[(1, (), "Which year?", False)]
    assert year.seeds == (0, 1, 2) and year.score == 60.0
    assert year.reward == pytest.approx((60 - 10 + 35) / 3)
    assert year.parts == pytest.approx(
        {"baseline": 20.0, "gain": 40.0, "question_cost": 25 / 3, "unknown_cost": 10 / 3}
    )
    assert found[(1, (), "Which city?", False)].reward == -20.0
    after_year = (("Which year?", "2024"),)
    assert found[(2, after_year, "Which city?", False)].reward == 60.0
    assert found[(2, after_year, "Which model?", False)].reward == -10.0
    stop = found[(2, after_year, "No more questions.", True)]
    assert (stop.reward, stop.seeds) == (35.0, (2,))
    # The turn-2 state after "Which city?" has one action: nothing to compare there.
    assert found[(2, (("Which city?", "Oslo"),), "Which year?", False)].samples == 1
    assert len(found) == 6

    pairs = dpo_pairs(collected.candidates, min_margin=10.0, pairing="best_vs_rest")
    assert [(p.chosen.turn, p.chosen.question, p.rejected.question, p.margin) for p in pairs] == [
        (1, "Which year?", "Which city?", pytest.approx(85 / 3 + 20)),
        (2, "Which city?", "Which model?", 70.0),
        (2, "Which city?", "No more questions.", 25.0),
    ]
    # SFT: each state's best action above 0 reward.
    examples = sft_examples(collected.candidates, min_score=0.0)
    assert [(e.best.turn, e.best.question) for e in examples] == [
        (1, "Which year?"),
        (2, "Which city?"),
    ]


def test_a_stop_costs_no_further_question_and_can_be_preferred():
    """Same restore score with or without the second question: the price on asking makes the
    stop the better action, and its row is the stop JSON the clarifier's schema gives."""
    records = [
        dialogue("A", 0, [("Which year?", "2024"), ("Which city?", "unknown")], 50.0),
        dialogue("A", 1, [("Which year?", "2024")], 50.0, stop="Nothing else to ask."),
    ]
    reward = RewardSettings(baseline="none", question_cost=3.0, unknown_cost=4.0)
    collected = collect(records, reward=reward, condition="clarify@2")
    (pair,) = dpo_pairs(collected.candidates, min_margin=5.0)
    # A second stop at the same state, in other words, is the same action.
    again = dialogue("A", 2, [("Which year?", "2024")], 40.0, stop="No further question.")
    stops = [c for c in collect([*records, again], reward=reward, condition="clarify@2")
             .candidates["A"] if c.stop]  # fmt: skip
    assert [(c.question, c.seeds, c.reward) for c in stops] == [
        ("Nothing else to ask.", (1, 2), (47.0 + 37.0) / 2)
    ]
    assert (pair.chosen.stop, pair.rejected.question, pair.margin) == (True, "Which city?", 7.0)
    instance = sample_instance("A-train-01")
    row = dpo_row(pair, instance, allow_stop=True)
    assert row["turn"] == 2
    assert json.loads(row["chosen"][0]["content"]) == {
        "question": "Nothing else to ask.",
        "stop": True,
    }
    assert json.loads(row["rejected"][0]["content"]) == {"question": "Which city?", "stop": False}
    assert row["prompt"] == prompt_messages(instance, [QA(question="Which year?", answer="2024")])


async def test_a_later_turns_prompt_is_what_clarifier_ask_sends_at_that_turn():
    instance = sample_instance("A-train-01")
    history = [QA(question="Which year?", answer="2024")]
    engine = ScriptedEngine(lambda request: json.dumps({"question": "Which city?", "stop": False}))
    await clarifier.ask(
        engine, instance.blurred_query, history, instance.language, Sampling(), allow_stop=True
    )
    sent = [m.model_dump() for m in engine.requests[0].messages]
    records = [
        dialogue("A-train-01", 0, [("Which year?", "2024"), ("Which city?", "Oslo")], 80.0),
        dialogue("A-train-01", 1, [("Which year?", "2024"), ("Which model?", "x")], 10.0),
    ]
    collected = collect(records, condition="clarify@2")
    (pair,) = dpo_pairs(collected.candidates, min_margin=10.0)
    row = dpo_row(pair, instance, allow_stop=True)
    assert row["prompt"] == sent and "2024" in sent[1]["content"]
    assert row["chosen"][0]["content"] == json.dumps({"question": "Which city?", "stop": False})


def test_dialogues_without_a_blurred_score_are_named_when_nothing_is_left(tmp_path):
    config = train_yaml(tmp_path, turns=2)
    write_samples(
        config,
        [
            dialogue("A-train-01", 0, [("Which year?", "2024"), ("Which city?", "x")], 80.0),
            dialogue("A-train-01", 1, [("Which city?", "x"), ("Which year?", "y")], 10.0),
        ],
    )
    result = runner.invoke(app, ["train", "pairs", "-c", str(config)])
    assert result.exit_code == 1
    assert "2 sampled dialogue(s) have no scored blurred run of their instance" in result.output
    assert "reward.baseline=none" in result.output
    loose = runner.invoke(
        app, ["train", "pairs", "-c", str(config), "--set", "reward.baseline=none"]
    )
    assert loose.exit_code == 0, loose.output


def test_fine_tuned_model_configs_swap_in_with_one_set(tmp_path):
    base = ModelConfig.model_validate(
        {
            "name": "Qwen/Qwen3-8B",
            "path": "Qwen/Qwen3-8B",
            "engine": "openai",
            # A base someone else serves: its server does not have the new weights.
            "endpoint": "http://elsewhere:8000/v1",
            "vllm": {"serve": False},
        }
    )
    merged = fine_tuned_config(base, "qwen3-8b-x", tmp_path, merged=True, lora_rank=16)
    assert merged.path == str((tmp_path / "checkpoint").resolve()) and merged.engine == "openai"
    assert merged.endpoint is None and merged.vllm.serve
    path = tmp_path / "clarifier.yaml"
    path.write_text(yaml.safe_dump(merged.model_dump(mode="json", exclude_defaults=True)))
    resolved = load_experiment("quickstart", [f"roles.clarifier.model={path}"])
    assert resolved.model_for("clarifier") == merged
    assert resolved.model_for("searcher").name == "smollm2-135m-searcher"

    lora = fine_tuned_config(base, "qwen3-8b-x", tmp_path, merged=False, lora_rank=32)
    assert lora.name == "qwen3-8b-x" and lora.path == "Qwen/Qwen3-8B" and lora.engine == "openai"
    assert lora.endpoint is None and lora.vllm.serve
    adapter = (tmp_path / "adapter").resolve()
    assert lora.vllm.extra_args == [
        # The base keeps its own name; requests for `name` reach the adapter.
        "--served-model-name",
        "Qwen/Qwen3-8B",
        "--enable-lora",
        "--lora-modules",
        f"qwen3-8b-x={adapter}",
        "--max-lora-rank",
        "32",
    ]


# -- the real thing on the tiny model -------------------------------------------------------------


def tiny_train_config(tmp_path: Path, llm_calls: int = 1, **extra: object) -> Path:
    """One query with one nugget (C-train-06's first) and two candidates, the smallest search
    budgets, caches in tmp_path; SFT with a bar below 0 (the tiny judge scores everything 0)."""
    instance = sample_instance("C-train-06").model_dump()
    instance["golden"]["nuggets"] = instance["golden"]["nuggets"][:1]
    dataset = tmp_path / "train.jsonl"
    dataset.write_text(json.dumps(instance) + "\n")
    return train_yaml(
        tmp_path,
        dataset=str(dataset),
        split=None,
        candidates=2,
        experiment_overrides=[
            f"budgets.max_llm_calls={llm_calls}",
            "search.top_k=1",
            "search.max_page_tokens=100",
            "search.date=2026-11-30",
            f"cache.path={tmp_path / 'responses.sqlite'}",
            f"search.tool_cache={tmp_path / 'tools.sqlite'}",
        ],
        method="sft",
        sft_min_score=-1,
        **{
            "reward": {"baseline": "none"},  # no blurred runs: the tiny judge scores all 0
            "epochs": 1,
            "batch_size": 1,
            "grad_accum": 1,
            "max_length": 256,
            "gradient_checkpointing": False,
            "logging_steps": 1,
            **extra,  # a caller's settings win
        },
    )


async def ask_with(model_config: Path) -> str:
    from cts.serving.model_config import build_engine

    engine = build_engine(load_model_config(model_config))
    try:
        asked = await clarifier.ask(
            engine,
            "What does the tour at Orlaby Castle Museum cost?",
            [],
            "en",
            Sampling(max_tokens=96),
        )
    finally:
        await engine.aclose()
    return asked.question


def assert_trained(out: Path, method: str, examples: int) -> dict:
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["method"] == method and metrics["examples"] == examples
    assert metrics["steps"] >= 1 and metrics["device"] == "cpu"
    assert metrics["log"] and all(math.isfinite(e["loss"]) for e in metrics["log"])
    assert (out / "adapter" / "adapter_config.json").is_file()
    # LoRA's B matrices start at zero: any nonzero entry is an optimizer step really taken.
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    lora_b = [t for name, t in adapter.items() if "lora_B" in name]
    assert lora_b and any(bool(t.abs().sum() > 0) for t in lora_b)
    assert (out / "checkpoint" / "config.json").is_file()
    assert list((out / "checkpoint").glob("*.safetensors"))
    return metrics


@pytest.mark.slow
def test_cts_train_all_then_dpo_on_the_tiny_model(tmp_path, tiny_path):
    """`cts train all` (real sampling, SFT, merge) → the checkpoint answers through the toolkit;
    then DPO on the same samples with a hand-scored candidate added (the tiny judge scores
    every question 0, so real samples alone give no pair)."""
    config = tiny_train_config(tmp_path)
    out = tmp_path / "out"
    result = cts("train", "all", "-c", str(config))
    assert result.exit_code == 0, result.output
    assert "2 records written" in result.output

    samples = read_records(out / "samples")[0]
    assert sorted((r.instance_id, r.condition, r.seed) for r in samples) == [
        ("C-train-06", "clarify@1", 0),
        ("C-train-06", "clarify@1", 1),
    ]
    scored = [r for r in samples if not r.error]
    assert scored, [r.error for r in samples]
    assert all(r.questions and "restore_score_100" in r.scores for r in scored)
    (example,) = [json.loads(x) for x in (out / "sft.jsonl").read_text().splitlines()]
    best = min(scored, key=lambda r: (-r.scores["restore_score_100"], r.seed))
    assert json.loads(example["messages"][-1]["content"]) == {
        "question": normalise(best.questions[0])
    }
    assert_trained(out, "sft", 1)

    model_config = out / "clarifier.yaml"
    swapped = load_experiment("quickstart", [f"roles.clarifier.model={model_config}"])
    clarifier_model = swapped.model_for("clarifier")
    # Named after its base, the train config and its weights' fingerprint.
    assert re.fullmatch(r"smollm2-135m-instruct-t-[0-9a-f]{8}", clarifier_model.name)
    labelled = load_experiment(
        "quickstart",
        [f"roles.clarifier.model={model_config}", "output_dir=runs/{name}-{clarifier}"],
    )
    assert labelled.output_dir() == Path(f"runs/quickstart-{clarifier_model.name}")
    assert clarifier_model.path == str((out / "checkpoint").resolve())
    assert clarifier_model.engine == "transformers"
    # Its own event loop: the CLI commands above ran theirs with asyncio.run.
    question = asyncio.run(ask_with(model_config))
    assert 3 <= len(question) <= 200

    # DPO: the same real samples, scored 10, plus one hand-scored question at 90.
    dpo_out = tmp_path / "dpo"
    (dpo_out / "samples" / "records" / "clarify@1").mkdir(parents=True)
    (dpo_out / "samples" / "config.yaml").write_text((out / "samples" / "config.yaml").read_text())
    store = RecordStore(dpo_out / "samples")
    for r in scored:
        store.append(r.model_copy(update={"scores": {"restore_score_100": 10.0}}), Shard())
    store.append(rec("C-train-06", 7, "Which tour do you mean?", 90.0), Shard())
    dpo = ["-c", str(config), "--set", "method=dpo", "--set", f"output_dir={dpo_out}"]
    pairs = cts("train", "pairs", *dpo)
    assert pairs.exit_code == 0, pairs.output
    (row,) = [json.loads(x) for x in (dpo_out / "pairs.jsonl").read_text().splitlines()]
    assert json.loads(row["chosen"][0]["content"]) == {"question": "Which tour do you mean?"}
    assert row["margin"] == 80.0
    fit = cts("train", "fit", *dpo)
    assert fit.exit_code == 0, fit.output
    metrics = assert_trained(dpo_out, "dpo", 1)
    # DPO's own statistics are logged: the trainer really compared chosen and rejected.
    assert any(k.startswith("rewards/") for k in metrics["log"][0])
    # Two merged 135M checkpoints are 1 GB: pytest keeps the last runs' tmp dirs.
    for checkpoint in (out / "checkpoint", dpo_out / "checkpoint"):
        shutil.rmtree(checkpoint)


@pytest.mark.slow
def test_train_loop_continues_from_each_fit_and_resumes(tmp_path, tiny_path, monkeypatch):
    """`cts train loop --iterations 2`: the runs (sampling, evaluations) on scripted engines —
    the loop's logic is the point — and every fit real, on the tiny model; iteration 2 samples
    with and trains on top of iteration 1's checkpoint; the table pairs every iteration with
    the base and the one before; a rerun does nothing again."""
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CTS_PROGRESS_EVERY_S", "0")
    monkeypatch.setattr(experiment_module, "open_engines", scripted_engines)
    config = tiny_train_config(
        tmp_path,
        llm_calls=2,  # the scripted searcher searches, then answers
        loop={
            "evaluation_overrides": ["dataset.limit=3", "conditions=[blurred, clarify@1, oracle]"],
            "robustness": {"other_judge": ["judge.show_query=true"]},
        },
    )
    out = tmp_path / "out"
    result = cts("train", "loop", "-c", str(config), "--iterations", "2")
    assert result.exit_code == 0, result.output

    first, second = out / "iter-1", out / "iter-2"
    for fitted in (first, second):
        assert_trained(fitted, "sft", examples=1)
    # Iteration 2 sampled with iteration 1's clarifier and trained on top of its checkpoint.
    sampled = RunDir(second / "samples").read_config().experiment.roles["clarifier"].model
    assert sampled == str((first / "clarifier.yaml").resolve())
    metrics = json.loads((second / "train_metrics.json").read_text())
    assert metrics["base_model"] == str((first / "checkpoint").resolve())
    # Every clarifier evaluated under both variants; iteration 2's is iteration 2's model.
    for variant in ("main", "other_judge"):
        for i in range(3):
            assert (out / "eval" / variant / f"iter-{i}" / "summary.json").is_file()
    evaluated = RunDir(out / "eval" / "main" / "iter-2").read_config()
    assert evaluated.experiment.roles["clarifier"].model == str(
        (second / "clarifier.yaml").resolve()
    )
    assert evaluated.experiment.dataset.split == "dev"  # held out: sampling read train.jsonl

    rows = json.loads((out / "loop" / "main" / "loop.json").read_text())
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert rows[0]["delta_vs_base"] == {} and rows[0]["delta_vs_previous"] == {}
    for row in rows[1:]:
        assert set(row["delta_vs_base"]) == {"blurred", "clarify@1", "oracle"}
        # Scripted runs score the same whatever the clarifier: every paired Δ is 0.
        assert {d["difference"] for d in row["delta_vs_base"].values()} == {0.0}
        assert {d["n"] for d in row["delta_vs_previous"].values()} == {3}
        assert row["questions_asked"] == {"clarify@1": 1.0}
    # Spent: calls a model answered, not the response cache. Iteration 1 sampled queries no run
    # had asked about; iteration 2's scripted clarifier asks what iteration 1's did, so every
    # answer it needed was in the cache: nothing spent, though its runs made calls.
    assert rows[1]["spent"]["model_calls"] > 0 and rows[1]["spent"]["prompt_tokens"] > 0
    assert rows[2]["spent"] == {"model_calls": 0, "prompt_tokens": 0, "completion_tokens": 0}
    cached = [r.usage.get("searcher_cached_calls", 0) for r in read_records(second / "samples")[0]]
    assert sum(cached) > 0
    table_md = (out / "loop" / "main" / "loop.md").read_text()
    assert "| 2 | clarify@1 |" in table_md and "Δ vs previous" in table_md
    # The signal each iteration's sampling gave its fit, from its pairs_stats.json.
    assert rows[0]["signal"] is None
    for row in rows[1:]:
        signal = row["signal"]
        assert signal["candidates"] > 0 and signal["reward_spread"]["states"] >= 0
        assert signal["kept_questions"]["n"] <= signal["kept"]
    assert "| iteration | candidates | distinct questions | reward spread |" in table_md
    assert (out / "loop" / "other_judge" / "loop.json").is_file()
    assert (out / "loop" / "main" / "report.html").is_file()

    trained_at = (second / "train_metrics.json").stat().st_mtime_ns
    again = cts("train", "loop", "-c", str(config), "--iterations", "2")
    assert again.exit_code == 0, again.output
    assert again.output.count("fitted before") == 2
    assert (second / "train_metrics.json").stat().st_mtime_ns == trained_at
    assert "0 records written" in again.output and " records written" in again.output
    assert all(
        line.startswith("0 records written")
        for line in again.output.splitlines()
        if "records written" in line
    )


def test_loop_deltas_are_the_later_iteration_minus_the_earlier(tmp_path):
    """The report compares the earlier system first (a − b); the loop turns it round."""
    comparisons = [
        Comparison(a="base", b="one", condition="clarify@1", difference=-3.0, low=-5.0,
                   high=-1.0, p_value=0.01, p_holm=0.02, n=7),
        Comparison(a="base", b="two", condition="clarify@1", difference=0.0, low=-2.0,
                   high=2.0, p_value=1.0, p_holm=1.0, n=7),
    ]  # fmt: skip
    assert _delta(comparisons, "base", "one") == {
        "clarify@1": {
            "difference": 3.0, "low": 1.0, "high": 5.0, "p_holm": 0.02, "p_value": 0.01, "n": 7
        }
    }  # fmt: skip
    same = _delta(comparisons, "base", "two")["clarify@1"]["difference"]
    assert math.copysign(1.0, same) == 1.0  # 0.0, not −0.0
    assert _delta(comparisons, "one", "two") == {}


def test_loop_plans_iterations_on_the_previous_checkpoint_and_refuses_bad_setups(tmp_path):
    config = load_train_config(train_yaml(tmp_path))
    loop = iterations(config, 2)
    assert [(i.index, i.train is None) for i in loop] == [(0, True), (1, False), (2, False)]
    assert loop[1].train is not None and loop[2].train is not None
    assert not any("roles.clarifier.model" in o for o in loop[1].train.experiment_overrides)
    assert loop[2].train.experiment_overrides[-1] == (
        f"roles.clarifier.model={(tmp_path / 'out' / 'iter-1' / 'clarifier.yaml').resolve()}"
    )
    assert loop[2].train.resolved_output_dir() == tmp_path / "out" / "iter-2"
    assert loop[1].eval_dir("main") == tmp_path / "out" / "eval" / "main" / "iter-1"
    with pytest.raises(LoopError, match="set merge: true"):
        iterations(load_train_config(train_yaml(tmp_path, merge=False)), 1)
    # Evaluating on the split the loop samples on is refused.
    with pytest.raises(ConfigError, match="evaluation reads the data it samples on"):
        evaluation(
            load_train_config(
                train_yaml(tmp_path, loop={"evaluation_overrides": ["dataset.split=train"]})
            ),
            loop[0],
            "main",
        )
    with pytest.raises(ConfigError, match="'main': a variant name"):
        load_train_config(train_yaml(tmp_path, loop={"robustness": {"main": []}}))


def test_iteration_0_evaluates_the_clarifier_the_loop_trains_from(tmp_path):
    """A clarifier set in `experiment_overrides` (sampling only) is the loop's base: iteration
    0 evaluates it, not the experiment's own, or "Δ vs base" would compare two models."""
    from cts.train.fit import base_model

    served = "smollm2-135m-instruct-vllm"
    config = load_train_config(
        train_yaml(tmp_path, experiment_overrides=[f"roles.clarifier.model={served}"])
    )
    base = iterations(config, 1)[0]
    assert base_model(config)[0] == served
    assert evaluation(config, base, "main").experiment.roles["clarifier"].model == served
    plain = load_train_config(train_yaml(tmp_path))
    assert evaluation(plain, base, "main").experiment.roles["clarifier"].model == (
        "smollm2-135m-instruct"
    )


def test_the_loop_is_one_list_of_steps_that_pairs_each_sharded_run_with_its_finish(tmp_path):
    """`cts train loop` runs these in order, `loop-step` one of them, the Slurm chain one job
    per (sharded run, finishing step) pair."""
    plan = iterations(load_train_config(train_yaml(tmp_path)), 2)
    steps = loop_steps(plan)
    assert [(s.name, s.iteration.index) for s in steps] == [
        ("eval", 0), ("table", 0),
        ("sample", 1), ("fit", 1), ("eval", 1), ("table", 1),
        ("sample", 2), ("fit", 2), ("eval", 2), ("table", 2),
    ]  # fmt: skip
    assert [s.sharded for s in steps[::2]] == [True] * 5
    assert not any(s.sharded for s in steps[1::2])
    assert steps[2].records_dir() == tmp_path / "out" / "iter-1" / "samples"
    assert steps[0].records_dir() == plan[0].eval_dir("main")
    assert loop_step(plan, "fit", 2) == steps[7]
    with pytest.raises(LoopError, match="step 'merge': expected one of eval, sample, fit, table"):
        loop_step(plan, "merge", 1)
    with pytest.raises(LoopError, match=r"iteration 3: the loop has iterations 0\.\.2"):
        loop_step(plan, "eval", 3)
    with pytest.raises(LoopError, match="sample of iteration 0: iteration 0 is the base"):
        loop_step(plan, "sample", 0)


def test_loop_counts_each_model_call_once():
    """A record's `search_*` usage repeats the searcher's own: counted once, per role."""
    usage = {
        "search_llm_calls": 3, "search_cached_calls": 0, "search_prompt_tokens": 5322,
        "search_completion_tokens": 328, "search_tool_errors": 0,
        "searcher_calls": 3, "searcher_cached_calls": 1, "searcher_prompt_tokens": 5322,
        "searcher_completion_tokens": 328,
        "judge_calls": 1, "judge_cached_calls": 0, "judge_prompt_tokens": 277,
        "judge_completion_tokens": 149,
    }  # fmt: skip
    record = Record(instance_id="i", condition="blurred", seed=0, usage=usage)
    assert _spent([record, record]) == {
        "model_calls": 8,
        "prompt_tokens": 2 * (5322 + 277),
        "completion_tokens": 2 * (328 + 149),
    }


def leave_a_fit(config: TrainConfig, metrics: dict[str, Any] | None = None) -> None:
    """A stand-in for `cts.train.fit.fit`: what a fit leaves, the clarifier's model config (the
    tiny model's, under the iteration's name) and train_metrics.json."""
    model = yaml.safe_load((CONFIG_DIR / "models" / "smollm2-135m-instruct.yaml").read_text())
    out = config.resolved_output_dir()
    (out / "clarifier.yaml").write_text(yaml.safe_dump({**model, "name": config.name}))
    (out / "train_metrics.json").write_text(json.dumps(metrics or {}))


class Killed(Exception):
    """Stands for the process being killed in the middle of a step."""


def test_a_loop_killed_between_steps_resumes_without_repeating_them(tmp_path, monkeypatch):
    """Killed during iteration 2's fit, `cts train loop` started again redoes nothing that
    finished (no evaluation or sampling record again, iteration 1 not refitted) and goes on
    from the fit. Runs on scripted engines; the fit is a stand-in writing what a fit leaves."""
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CTS_PROGRESS_EVERY_S", "0")
    monkeypatch.setattr(experiment_module, "open_engines", scripted_engines)
    fits: list[str] = []

    def fit(config):
        fits.append(config.name)
        if fits == ["t-iter1", "t-iter2"]:
            raise Killed
        leave_a_fit(config)

    monkeypatch.setattr(loop_runner_module, "fit", fit)
    config = tiny_train_config(
        tmp_path,
        llm_calls=2,
        loop={"evaluation_overrides": ["dataset.limit=2", "conditions=[clarify@1]"]},
    )
    with pytest.raises(Killed):
        cts("train", "loop", "-c", str(config), "--iterations", "2")
    out = tmp_path / "out"
    assert (out / "iter-2" / "samples" / "summary.json").is_file()
    assert not (out / "eval" / "main" / "iter-2").exists()

    again = cts("train", "loop", "-c", str(config), "--iterations", "2")
    assert again.exit_code == 0, again.output
    assert fits == ["t-iter1", "t-iter2", "t-iter2"]  # iteration 1 was not fitted again
    assert "iteration 1: fitted before" in again.output
    written = [line for line in again.output.splitlines() if " records written" in line]
    # eval 0, sample 1, eval 1, sample 2: all there already; eval 2 is new.
    assert len(written) == 5 and all(line.startswith("0 records written") for line in written[:4])
    assert written[4].startswith("2 records written")
    rows = json.loads((out / "loop" / "main" / "loop.json").read_text())
    assert [r["iteration"] for r in rows] == [0, 1, 2]


def test_the_loop_runs_from_python_step_by_step(tmp_path, monkeypatch):
    """`loop_runner_module.run_loop` (what `cts train loop` prints): every step of the one list
    in order, each with what it did; on scripted engines, the fit a stand-in."""
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(experiment_module, "open_engines", scripted_engines)

    monkeypatch.setattr(loop_runner_module, "fit", leave_a_fit)
    config = load_train_config(
        tiny_train_config(
            tmp_path,
            llm_calls=2,
            loop={"evaluation_overrides": ["dataset.limit=2", "conditions=[clarify@1]"]},
        )
    )
    lines: list[str] = []
    done = list(loop_runner_module.run_loop(config, 1, show_progress=False, notify=lines.append))
    assert [(d.step.name, d.step.iteration.index) for d in done] == [
        ("eval", 0), ("table", 0), ("sample", 1), ("fit", 1), ("eval", 1), ("table", 1),
    ]  # fmt: skip
    assert [d.records_written for d in done] == [2, 0, done[2].records_written, 0, 2, 0]
    assert done[2].records_written > 0 and not any(d.interrupted for d in done)
    assert done[3].pairs is not None and done[3].pairs.rows
    (main,) = done[5].tables
    assert main.variant == "main" and main.json.is_file() and main.report_html.is_file()
    assert lines[0].startswith("iteration 0: evaluating ")
    assert any(line.startswith("sampling ") for line in lines)
    # The shipped role adapters were fitted on the train split this loop samples: said, by role.
    warned = [line for line in lines if line.startswith("WARNING role ")]
    assert [w.split(" (")[0] for w in warned] == [
        "WARNING role user_answerer", "WARNING role rewriter", "WARNING role searcher",
    ]  # fmt: skip
    again = list(loop_runner_module.run_loop(config, 1, show_progress=False))
    assert [d.records_written for d in again] == [0] * 6  # resumed: nothing runs again
    assert again[3].fitted_before == tmp_path / "out" / "iter-1" / "clarifier.yaml"


def test_the_sampling_run_says_what_cts_run_would_note_before_its_first_key(tmp_path, monkeypatch):
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(experiment_module, "open_engines", scripted_engines)
    path = tiny_train_config(tmp_path)
    document = yaml.safe_load(path.read_text())
    document["experiment_overrides"].append("roles.judge.sampling.temperature=0.7")
    path.write_text(yaml.safe_dump(document))
    lines: list[str] = []
    loop_runner_module.sample(
        load_train_config(str(path)), show_progress=False, notify=lines.append
    )
    assert "note: roles.judge.sampling.temperature=0.7 is not used" in "\n".join(lines)


def test_a_loop_resumed_with_another_fit_configuration_is_refused_with_the_diff(
    tmp_path, monkeypatch
):
    """A fit records the configuration it was made with (train_metrics.json, as the real fit
    writes it). A loop resumed with another `learning_rate`, `method` or `epochs` must not
    take the old fit as this configuration's: refused with what changed, exit 2, nothing
    refitted. What no fit depends on (logging, the loop's evaluation settings) may change."""
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CTS_PROGRESS_EVERY_S", "0")
    monkeypatch.setattr(experiment_module, "open_engines", scripted_engines)
    fits: list[str] = []

    def fit(config):  # the configuration included, as the real fit records it
        fits.append(config.name)
        leave_a_fit(config, {"train_config": config.model_dump(mode="json")})

    monkeypatch.setattr(loop_runner_module, "fit", fit)
    config = tiny_train_config(
        tmp_path,
        llm_calls=2,
        loop={"evaluation_overrides": ["dataset.limit=2", "conditions=[clarify@1]"]},
    )
    loop = ["train", "loop", "-c", str(config), "--iterations", "1"]
    assert cts(*loop).exit_code == 0 and fits == ["t-iter1"]
    metrics = (tmp_path / "out" / "iter-1" / "train_metrics.json").read_bytes()

    changed = cts(*loop, "--set", "learning_rate=0.001", "--set", "method=dpo")
    assert changed.exit_code == 2, changed.output
    assert "iteration 1 was fitted with another configuration" in changed.output
    assert "learning_rate: 5e-05 → 0.001" in changed.output
    assert 'method: "sft" → "dpo"' in changed.output
    assert "fitted before" not in changed.output and fits == ["t-iter1"]
    assert (tmp_path / "out" / "iter-1" / "train_metrics.json").read_bytes() == metrics

    free = cts(*loop, "--set", "logging_steps=5", "--set", "loop.iterations=3")
    assert free.exit_code == 0, free.output
    assert "iteration 1: fitted before" in free.output and fits == ["t-iter1"]


def test_a_fine_tune_of_a_fine_tune_is_named_after_its_base_model(tmp_path):
    """Iteration 2 of a loop trains on iteration 1's clarifier.yaml: the new model's name
    starts with the served name inside that file (path-safe), not the file's stem."""
    from cts.train.fit import base_model

    model = yaml.safe_load((CONFIG_DIR / "models" / "smollm2-135m-instruct.yaml").read_text())
    first = tmp_path / "clarifier.yaml"
    first.write_text(yaml.safe_dump({**model, "name": "org/tiny-t-iter1-0123abcd"}))
    config = load_train_config(
        train_yaml(tmp_path, experiment_overrides=[f"roles.clarifier.model={first}"])
    )
    key, base = base_model(config)
    assert key == "org-tiny-t-iter1-0123abcd" and base.name == "org/tiny-t-iter1-0123abcd"
    assert base_model(load_train_config(train_yaml(tmp_path)))[0] == "smollm2-135m-instruct"
