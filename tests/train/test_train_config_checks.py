"""A train config's values that would be ignored, replaced or not numbers are refused when it
is loaded or its experiments derived, naming the file, line and key to change."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cts.eval.data.dataset import SAMPLE_DIR, load_instances
from cts.foundation.yaml_config import ConfigError
from cts.train.config import load_train_config
from cts.train.loop import MAIN, evaluation, iterations
from cts.train.sample import sampling_experiment

HEAD = "name: t\nexperiment: quickstart\nsplit: train\nlimit: 2\n"


def written(tmp_path: Path, body: str) -> Path:
    """HEAD (lines 1-4) then `body` from line 5, the output in tmp_path."""
    path = tmp_path / "train.yaml"
    path.write_text(HEAD + body + f"output_dir: {tmp_path / 'out'}\n")
    return path


@pytest.mark.parametrize(
    "override",
    [
        "grpo.invalid_reward=nan",
        "reward.question_cost=inf",
        "reward.unknown_cost=.nan",
        "temperature=inf",
        "learning_rate=inf",
        "sft_min_score=nan",
        "min_margin=inf",
        "epochs=inf",
        "lora.dropout=nan",
    ],
)
def test_values_that_are_no_finite_number_are_refused(override):
    """An infinite question cost makes every reward −inf, a nan reward poisons GRPO's group
    mean, and rollouts.jsonl would hold `Infinity` (not JSON)."""
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"--set {key}: Input should be a finite number"):
        load_train_config("quickstart", [override])


def test_an_invalid_question_earns_no_more_than_the_worst_restore_gain():
    """`grpo.invalid_reward` is the worst a restore gain can be (−100): above it, a cut-off
    question would beat one that lost the whole score."""
    for worse in ("-100", "-250.5"):
        assert load_train_config("quickstart", [f"grpo.invalid_reward={worse}"])
    for better in ("50", "-99.9", "0"):
        with pytest.raises(ConfigError, match=r"grpo.invalid_reward: .*less than or equal to -100"):
            load_train_config("quickstart", [f"grpo.invalid_reward={better}"])


def test_turns_stop_at_the_deepest_clarify_condition(tmp_path):
    """clarify@3 is the deepest condition: `turns: 4` was accepted, then refused as the
    experiment's `--set conditions.1`, at the `experiment:` line."""
    assert load_train_config(written(tmp_path, "turns: 3\n")).turns == 3
    config = written(tmp_path, "turns: 4\n")
    with pytest.raises(ConfigError) as e:
        load_train_config(config)
    assert str(e.value) == f"{config}:5: turns: Input should be less than or equal to 3"


def test_experiment_overrides_of_what_sampling_derives_are_refused(tmp_path):
    """Sampling sets these keys from the train config after `experiment_overrides`: an entry
    setting one was replaced unsaid. Refused at the entry's line, naming the key to set."""
    cases = {
        "dataset.limit=2": "dataset.limit.*train config's `limit`",
        "dataset.split=dev": "dataset.split.*`split`",
        "dataset={split: dev}": "dataset.split.*`split`",
        "clarification.allow_stop=true": "clarification.allow_stop.*`allow_stop`",
        "roles.clarifier.sampling.temperature=0.3": "temperature.*`temperature`",
        "roles.clarifier.sampling={temperature: 0.3, top_p: 0.9}": "`temperature`",
        "clarification.mode=all_at_once": "clarification.mode.*sequential dialogues",
        "seeds=[0, 1, 2]": "seeds.*`candidates`",
        "conditions=[clarify@2]": "conditions.*`turns`",
    }
    for entry, said in cases.items():
        config = written(
            tmp_path, f"experiment_overrides:\n  - budgets.max_llm_calls=2\n  - '{entry}'\n"
        )
        with pytest.raises(ConfigError) as e:
            sampling_experiment(load_train_config(config), check_instances=False)
        assert str(e.value).startswith(f"{config}:7: experiment_overrides.1: {entry!r} sets ")
        assert re.search(said, str(e.value)), str(e.value)
    # What sampling does not derive passes: the budgets, the clarifier's model, its top_p,
    # the dataset's path when the train config names none.
    kept = written(
        tmp_path,
        "experiment_overrides:\n  - budgets.max_llm_calls=2\n"
        "  - roles.clarifier.model=smollm2-135m-instruct\n"
        "  - roles.clarifier.sampling.top_p=0.9\n",
    )
    resolved = sampling_experiment(load_train_config(kept), check_instances=False)
    assert resolved.experiment.budgets.max_llm_calls == 2
    assert resolved.sampling_for("clarifier").top_p == 0.9


def test_loop_evaluation_overrides_errors_name_their_own_line(tmp_path):
    """`dataset.limt=5` on line 7 was reported at line 2 (`experiment:`) as `--set`."""
    config = written(
        tmp_path,
        "loop:\n  evaluation_overrides:\n    - dataset.limt=5\n"
        "  robustness:\n    other:\n      - search.top_kk=1\n",
    )
    loaded = load_train_config(config)
    plan = iterations(loaded, 1)
    with pytest.raises(ConfigError) as e:
        evaluation(loaded, plan[0], MAIN, check_instances=False)
    assert str(e.value).splitlines()[1] == (
        f"{config}:7: loop.evaluation_overrides.0 → dataset.limt: unknown key"
    )
    with pytest.raises(ConfigError) as e:
        evaluation(loaded, plan[0], "other", check_instances=False)
    assert f"{config}:10: loop.robustness.other.0 → search.top_kk: unknown key" in str(e.value)


@pytest.mark.parametrize(
    ("where", "entry"),
    [
        ("evaluation_overrides", "roles.clarifier.model=qwen3-8b"),
        ("evaluation_overrides", "roles.clarifier={model: qwen3-8b}"),
        ("robustness", "roles={clarifier: {model: qwen3-8b}}"),
    ],
)
def test_a_clarifier_set_for_the_loops_evaluations_is_refused(tmp_path, where, entry):
    """Iteration 0 would evaluate that clarifier, iterations ≥ 1 their fine-tunes of the base
    one: Δ vs base would compare two models. The base comes from experiment_overrides."""
    body = (
        f"loop:\n  evaluation_overrides:\n    - dataset.limit=2\n    - '{entry}'\n"
        if where == "evaluation_overrides"
        else f"loop:\n  robustness:\n    other:\n      - dataset.limit=2\n      - '{entry}'\n"
    )
    config = load_train_config(written(tmp_path, body))
    with pytest.raises(ConfigError) as e:
        iterations(config, 1)
    where_said = (
        "loop.evaluation_overrides.1"
        if where == "evaluation_overrides"
        else ("loop.robustness.other.1")
    )
    line = 8 if where == "evaluation_overrides" else 9
    assert str(e.value).startswith(
        f"{config.path}:{line}: {where_said}: {entry!r} sets the clarifier"
    )
    assert "experiment_overrides" in str(e.value)
    # Other roles and the clarifier's sampling may differ per variant.
    fine = load_train_config(
        written(tmp_path, "loop:\n  robustness:\n    other: [roles.judge.model=qwen3-32b]\n")
    )
    assert len(iterations(fine, 1)) == 2


def test_a_split_of_a_file_other_than_its_rows_is_refused(tmp_path):
    """A file has no splits and is read whole: `split: dev` on it sampled every row unsaid.
    `train` (what `datasets` calls a file's rows, and the default) and null read the file."""
    rows = SAMPLE_DIR / "train.jsonl"
    whole = len(rows.read_text().splitlines())
    for split in ("null", "train"):
        config = load_train_config(
            written(tmp_path, f"dataset: {rows}\n"), [f"split={split}", "limit=null"]
        )
        resolved = sampling_experiment(config, check_instances=False)
        assert len(load_instances(resolved.experiment.dataset)) == whole
    config = (
        written(tmp_path, f"dataset: {rows}\n").read_text().replace("split: train", "split: dev")
    )
    path = tmp_path / "dev.yaml"
    path.write_text(config)
    with pytest.raises(ConfigError) as e:
        sampling_experiment(load_train_config(path), check_instances=False)
    assert str(e.value).startswith(f"{path}:3: split: 'dev': {rows} is a file, which has no splits")
    assert "split: null" in str(e.value)
