"""`cts train grpo`: the clarifier's first question trained online, each sampled question scored
by the experiment's pipeline. The policy is the tiny real model under TRL; the roles after it
are scripted (the reward's plumbing is the point; their models are tested elsewhere)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from safetensors.torch import load_file

import eval.run
import train.grpo
from agents import clarifier
from eval.config import ResolvedExperiment, Role, load_experiment
from eval.engines import Engines
from serving.engine import ChatModel
from serving.model_config import build_engine
from serving.types import ChatRequest
from serving.yaml_config import ConfigError
from tests import scripted_cts
from tests.scripted import ScriptedEngine, fused_query, scripted_roles
from tests.test_train import cts, read_records, tiny_train_config, train_yaml, wide_terminal
from train.config import load_train_config
from train.grpo import GrpoError, downstream_models, experiment, prompt_rows

__all__ = ["wide_terminal"]


def answers_by_parity() -> dict[str, ScriptedEngine]:
    """Scripted roles whose User Answerer answers a question of odd length (with the fused
    query's first word: answers are spans of it) and says `unknown` to one of even length:
    with a price on `unknown`, two questions of one group earn different rewards, so GRPO has
    something to learn from."""
    roles = scripted_roles()

    def user_answerer(request: ChatRequest) -> str:
        question = request.messages[-1].content
        return fused_query(request).split()[0] if len(question) % 2 else "unknown"

    roles["user_answerer"] = ScriptedEngine(user_answerer, name="user_answerer")
    return roles


@asynccontextmanager
async def real_clarifier(
    resolved: ResolvedExperiment, roles: list[Role] | None = None, use_cache: bool = True
) -> AsyncIterator[Engines]:
    """Scripted engines but the clarifier, built from its model config as `cts run` does."""
    async with scripted_cts.scripted_engines(resolved, roles, use_cache) as engines:
        real = build_engine(resolved.model_for("clarifier"))
        by_role: dict[Role, ChatModel] = {**engines.roles, "clarifier": real}
        try:
            yield Engines({**engines.by_model, "clarifier": real}, by_role, engines.cache)
        finally:
            await real.aclose()


def grpo_config(tmp_path: Path, **grpo: object) -> Path:
    return tiny_train_config(
        tmp_path,
        llm_calls=2,  # the scripted searcher searches, then answers
        reward={"baseline": "blurred", "question_cost": 5.0, "unknown_cost": 20.0},
        grpo={
            "num_generations": 4,
            "prompts_per_step": 1,
            "max_steps": 2,
            "save_steps": 1,
            "max_completion_length": 64,
            **grpo,
        },
    )


@pytest.mark.slow
def test_grpo_trains_on_pipeline_rewards_resumes_and_swaps_in(tmp_path, tiny_path, monkeypatch):
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(scripted_cts, "scripted_roles", answers_by_parity)
    monkeypatch.setattr(train.grpo, "open_engines", scripted_cts.scripted_engines)
    config = grpo_config(tmp_path)
    out = tmp_path / "out" / "grpo"

    result = cts("train", "grpo", "-c", str(config))
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "grpo_metrics.json").read_text())
    assert metrics["steps"] == 2 and metrics["device"] == "cpu"
    assert metrics["log"] and all(math.isfinite(e["loss"]) for e in metrics["log"])

    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    # 2 steps x 1 query x 4 questions, the i-th under seed i.
    assert [(r["step"], r["seed"]) for r in rollouts] == [(s, i) for s in (0, 1) for i in range(4)]
    for r in rollouts:
        if r["error"] is not None:
            # Cut off at max_completion_length: not the schema's JSON, priced as the worst.
            assert r["error"]["stage"] == "clarify" and r["reward"] == -100.0
            continue
        # Sampled under the clarifier's schema: the completion is its JSON, the question in it.
        assert json.loads(r["completion"]) == {"question": r["question"]}
        unknown = r["answer"] == "unknown"
        assert unknown == (len(r["question"]) % 2 == 0)
        # reward = score − blurred baseline − 5 per question − 20 per `unknown`, by hand.
        assert r["question_cost"] == 5.0 and r["unknown_cost"] == (20.0 if unknown else 0.0)
        assert r["reward"] == pytest.approx(
            r["score"] - r["baseline"] - 5.0 - (20.0 if unknown else 0.0)
        )
    assert any(len({r["reward"] for r in rollouts if r["step"] == s}) > 1 for s in (0, 1))
    # A group whose rewards differ moves the adapter (LoRA's B matrices start at zero).
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    assert any(bool(t.abs().sum() > 0) for name, t in adapter.items() if "lora_B" in name)

    # The same config again: nothing to do.
    again = cts("train", "grpo", "-c", str(config))
    assert again.exit_code == 0 and "trained before" in again.output, again.output

    # One step more: resumed from the last checkpoint, only step 2 is sampled.
    more = cts("train", "grpo", "-c", str(config), "--set", "grpo.max_steps=3")
    assert more.exit_code == 0, more.output
    assert re.search(r"resumed from \S*checkpoint-2", more.output), more.output
    lines = (out / "rollouts.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0] * 4 + [1] * 4 + [2] * 4
    resumed = json.loads((out / "grpo_metrics.json").read_text())
    assert resumed["steps"] == 3 and resumed["resumed_from"].endswith("checkpoint-2")
    # Failures are counted by stage and kind (every one the question's own here).
    assert set(resumed["rollout_failures"]) <= {"clarify:constrained_output_invalid"}

    # `cts run` takes the trained clarifier through one --set; it really asks with it.
    model_config = out / "clarifier.yaml"
    assert re.fullmatch(
        r"smollm2-135m-instruct-t-grpo-[0-9a-f]{8}",
        load_experiment("quickstart", [f"roles.clarifier.model={model_config}"])
        .model_for("clarifier")
        .name,
    )
    monkeypatch.setattr(eval.run, "open_engines", real_clarifier)
    run_dir = tmp_path / "run"
    ran = cts(
        "run", "--output-dir", str(run_dir), "--limit", "1",
        "--set", "conditions=[clarify@1]",
        "--set", f"roles.clarifier.model={model_config}",
        "--set", f"cache.path={tmp_path / 'responses.sqlite'}",
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    (record,) = read_records(run_dir)[0]
    assert record.error is None and record.questions and 3 <= len(record.questions[0]) <= 200


def test_grpo_prompts_are_the_clarifiers_first_turn_and_refuse_what_it_cannot_train(tmp_path):
    config = load_train_config(train_yaml(tmp_path, limit=2))
    resolved = experiment(config)
    rows, instances = prompt_rows(resolved)
    assert [r["instance_id"] for r in rows] == [i.id for i in instances] and len(rows) == 2
    first = instances[0]
    expected = clarifier.messages(first.blurred_query, [], first.language)
    assert rows[0]["prompt"] == [m.model_dump() for m in expected]
    assert clarifier.output(config.allow_stop).json_schema["required"] == ["question"]
    stop = load_train_config(train_yaml(tmp_path, allow_stop=True))
    assert set(clarifier.output(stop.allow_stop).json_schema["required"]) == {"question", "stop"}
    # The policy is trained in-process: --serve starts the other roles' models only.
    assert "smollm2-135m-instruct" in downstream_models(resolved)

    with pytest.raises(GrpoError, match=r"turns.*GRPO trains the first question"):
        experiment(load_train_config(train_yaml(tmp_path, turns=2)))
    with pytest.raises(GrpoError, match="vllm_server_base_url"):
        experiment(
            load_train_config(train_yaml(tmp_path, grpo={"use_vllm": True, "vllm_mode": "server"}))
        )
    with pytest.raises(ConfigError, match="split"):
        experiment(load_train_config(train_yaml(tmp_path, split="dev")))
    with pytest.raises(ConfigError, match="num_generations"):
        load_train_config(train_yaml(tmp_path, grpo={"num_generations": 1}))


def test_shipped_grpo_configs_resolve():
    """The tiny quickstart's few steps, and the commented GPU example: vLLM samples under the
    clarifier's schema, every role but the clarifier is served for the rollouts."""
    quick = load_train_config(None)
    assert quick.grpo.max_steps <= 5 and experiment(quick).experiment.dataset.split == "train"
    real = load_train_config("qwen3-8b-grpo")
    resolved = experiment(real, check_instances=False)  # its data is not shipped
    assert real.grpo.use_vllm and real.turns == 1
    assert resolved.model_for("clarifier").name == "Qwen/Qwen3-8B"
    served = downstream_models(resolved)
    assert "qwen3-8b" not in served and {"qwen3-32b", "webdancer-32b"} <= set(served)
    assert resolved.experiment.conditions == ["blurred", "clarify@1"]
