"""`cts train grpo` without a model: TRL's trainer is a stand-in that calls the real reward
function once per step (every role of the pipeline scripted) and leaves checkpoint-N every
save_steps, as GRPOTrainer does. What is tested is what grpo() does around the trainer:
resuming, the failures it counts, what it logs."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

import cts.train.grpo as grpo_module
from cts.train.config import load_train_config
from cts.train.grpo import PipelineReward, experiment, grpo, prompt_rows
from cts.train.grpo_resume import GrpoError, failure_counts
from tests import scripted_cts
from tests.builders import cts

pytestmark = pytest.mark.usefixtures("wide_terminal")

#: What the stand-in policy writes for the i-th question of a group; the second is cut off
#: (not the schema's JSON: an invalid question).
QUESTIONS = [json.dumps({"question": "Which year?"}), '{"question": "Which ye']


class StandInTrainer:
    """GRPOTrainer's part grpo() relies on: one reward call per step over one query's group,
    resume from a checkpoint's step, checkpoint-N every save_steps and at the end."""

    def __init__(
        self, model: Any, reward_funcs: list[Any], args: Any, train_dataset: Any, **_: Any
    ):
        self.reward, self.args, self.rows = reward_funcs[0], args, list(train_dataset)
        self.state = types.SimpleNamespace(global_step=0, log_history=[])
        self.logged: list[tuple[str, float]] = []

    def train(self, resume_from_checkpoint: str | None = None) -> Any:
        if resume_from_checkpoint:
            self.state.global_step = int(resume_from_checkpoint.rsplit("-", 1)[1])
        n = self.args.num_generations
        while self.state.global_step < self.args.max_steps:
            row = self.rows[self.state.global_step % len(self.rows)]
            self.reward(
                [row["prompt"]] * n,
                QUESTIONS[:n],
                [row["instance_id"]] * n,
                trainer_state=self.state,
                log_metric=lambda key, value: self.logged.append((key, value)),
            )
            self.state.global_step += 1
            step = self.state.global_step
            if step % self.args.save_steps == 0 or step == self.args.max_steps:
                (Path(self.args.output_dir) / f"checkpoint-{step}").mkdir(parents=True)
            self.state.log_history.append({"loss": 0.0, "step": step})
        return types.SimpleNamespace(global_step=self.state.global_step, training_loss=0.0)


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """grpo() with scripted roles and the stand-in trainer: no weights are loaded or saved."""
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(grpo_module, "open_engines", scripted_cts.scripted_engines)
    base = types.SimpleNamespace(chat_template_kwargs={}, revision=None, name="tiny")
    base.resolved_path = lambda: "tiny"  # type: ignore[attr-defined]

    def save_weights(trainer: Any, tokenizer: Any, output: Path, merge: bool) -> Any:
        (output / "adapter").mkdir(exist_ok=True)
        return output / "adapter", None

    def write_model_config(model_config: Any, base: Any, config: Any, out: Path, m: str) -> Path:
        (out / "clarifier.yaml").write_text("name: tiny-grpo\n")
        return out / "clarifier.yaml"

    for name, value in {
        "require_train_extra": lambda: None,
        "base_model": lambda config: ("tiny", base),
        "load_tokenizer": lambda *a: None,
        "load_policy": lambda base, dtype: (object(), None),
        "precision": lambda config: ("float32", True, False, False),
        "lora_config": lambda config: None,
        "checkpointing": lambda on: {},
        "save_weights": save_weights,
        "weights_fingerprint": lambda adapter: "deadbeef",
        "result_config": lambda *a: None,
        "write_model_config": write_model_config,
        "run_metrics": lambda config, seconds, cpu, dtype, log: {
            "seconds": 0.0,
            "device": "cpu",
            "dtype": "float32",
            "log": log,
            "train_config": config.model_dump(mode="json"),
        },
    }.items():
        monkeypatch.setattr(grpo_module, name, value)
    trl = types.ModuleType("trl")
    trl.GRPOConfig = lambda **kw: types.SimpleNamespace(**kw)  # type: ignore[attr-defined]
    trl.GRPOTrainer = StandInTrainer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "trl", trl)


def grpo_yaml(tmp_path: Path, unknown_cost: float = 20.0, **grpo_settings: object) -> Path:
    doc = {
        "name": "g",
        "experiment": "quickstart",
        "split": "train",
        "limit": 1,
        "experiment_overrides": [
            "budgets.max_llm_calls=2",
            "search.top_k=1",
            "search.max_page_tokens=100",
            "search.date=2026-11-30",
            f"cache.path={tmp_path / 'r.sqlite'}",
            f"search.tool_cache={tmp_path / 't.sqlite'}",
        ],
        "reward": {"baseline": "none", "question_cost": 5.0, "unknown_cost": unknown_cost},
        "grpo": {"num_generations": 2, "prompts_per_step": 1, "max_steps": 2, "save_steps": 1}
        | grpo_settings,
        "output_dir": str(tmp_path / "out"),
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def steps_of(out: Path) -> list[int]:
    lines = (out / "rollouts.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


def test_a_rerun_under_another_reward_is_refused_and_one_with_more_steps_resumes(
    tmp_path, stand_in
):
    """Resuming the checkpoints of `unknown_cost: 20` under `unknown_cost: 0` would train the
    steps after them on other rewards, and rollouts.jsonl would hold both prices; refused
    before anything is dropped, naming what changed. More steps (a key no trained weight
    depends on) resume."""
    out = tmp_path / "out" / "grpo"
    first = grpo(load_train_config(grpo_yaml(tmp_path, unknown_cost=20.0)))
    assert first.resumed_from is None and steps_of(out) == [0, 0, 1, 1]
    recorded = json.loads((out / "trainer" / "train_config.json").read_text())
    assert recorded["reward"]["unknown_cost"] == 20.0

    changed = load_train_config(grpo_yaml(tmp_path, unknown_cost=0.0, max_steps=3))
    for start in (experiment, grpo):  # `cts train grpo` asks experiment() before serving
        with pytest.raises(GrpoError) as refused:
            start(changed)
        assert "reward.unknown_cost: 20.0 → 0.0" in str(refused.value)
        assert "max_steps" not in str(refused.value)
    assert steps_of(out) == [0, 0, 1, 1]  # nothing dropped, nothing sampled

    more = grpo(load_train_config(grpo_yaml(tmp_path, unknown_cost=20.0, max_steps=3)))
    assert more.resumed_from is not None and more.resumed_from.endswith("checkpoint-2")
    assert steps_of(out) == [0, 0, 1, 1, 2, 2]
    assert more.metrics["steps"] == 3


def test_invalid_questions_are_counted_apart_from_failures_left_out(tmp_path, stand_in):
    """A question cut off earns invalid_reward and stays in its group: it is no failure left
    out of it. Per step here: one question scored, one cut off (2 steps: 2 invalid, 0 left
    out); the logged restore/failed counts only the left-out ones."""
    result = cts("train", "grpo", "-c", str(grpo_yaml(tmp_path)))
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "invalid questions" in line)
    row = next(line for line in result.output.splitlines() if "│ grpo" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    names = [c.strip() for c in header.split("┃")[1:-1]]
    assert dict(zip(names, cells, strict=True))["invalid questions"] == "2"
    assert dict(zip(names, cells, strict=True))["left out"] == "0"
    metrics = json.loads((tmp_path / "out" / "grpo" / "grpo_metrics.json").read_text())
    assert metrics["rollout_failures"] == {"clarify:constrained_output_invalid": 2}

    assert failure_counts({"clarify:constrained_output_invalid": 3, "search:timeout": 2}) == (
        3,
        2,
    )
    assert failure_counts({"blurred:no_score": 1}) == (0, 1)


def test_the_logged_failures_are_the_rollouts_left_out_of_their_groups(tmp_path, stand_in):
    config = load_train_config(grpo_yaml(tmp_path))
    resolved = experiment(config)
    _, instances = prompt_rows(resolved)
    reward = PipelineReward(config, resolved, instances, tmp_path / "rollouts.jsonl")
    logged: dict[str, float] = {}
    reward.open()
    try:
        rewards = reward(
            [None] * 2,
            QUESTIONS,
            [instances[0].id] * 2,
            log_metric=lambda key, value: logged.__setitem__(key, value),
        )
    finally:
        reward.close()
    # The cut-off question is priced, not left out: its group keeps both.
    assert rewards[1] == -100.0 and rewards[0] is not None
    assert logged["restore/failed"] == 0.0 and logged["restore/invalid"] == 1.0
