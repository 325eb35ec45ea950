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

import cts.eval.experiment as experiment_module
import cts.train.grpo as grpo_module
from cts.agents import clarifier
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.eval.run.config_sections import Role
from cts.eval.run.engines import Engines
from cts.foundation.yaml_config import ConfigError
from cts.serving.engine import ChatModel
from cts.serving.model_config import build_engine
from cts.serving.scripted import ScriptedEngine, fused_query, scripted_roles
from cts.serving.types import ChatRequest
from cts.train.config import load_train_config
from cts.train.grpo import downstream_models, experiment, prompt_rows
from cts.train.grpo_resume import GrpoError
from tests import scripted_cts
from tests.builders import cts
from tests.train.test_train import read_records, tiny_train_config, train_yaml

pytestmark = pytest.mark.usefixtures("wide_terminal")


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
    monkeypatch.setattr(grpo_module, "open_engines", scripted_cts.scripted_engines)
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
    monkeypatch.setattr(experiment_module, "open_engines", real_clarifier)
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


def test_colocated_vllm_gets_a_window_sized_to_the_prompts(tmp_path, tiny_path):
    """GRPO colocates vLLM with the trainer on one GPU at TRL's 0.3 share. Without a window,
    vLLM takes the model's own (40k tokens for Qwen3-8B): ~5.6 GiB of KV in the ~6.5 GiB the
    share leaves beside the weights. The window is the longest training prompt plus the
    completion, rounded up to 256; set explicitly, it is kept."""
    from transformers import AutoTokenizer

    config = load_train_config(train_yaml(tmp_path, limit=3, grpo={"use_vllm": True}))
    rows, _ = prompt_rows(experiment(config))
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    args = grpo_module.vllm_args(config.grpo, rows, tokenizer, {})
    longest = max(
        len(tokenizer(tokenizer.apply_chat_template(r["prompt"], tokenize=False,
            add_generation_prompt=True), add_special_tokens=False)["input_ids"])
        for r in rows
    )  # fmt: skip
    needed = longest + config.grpo.max_completion_length
    assert args["vllm_max_model_length"] % 256 == 0
    assert needed <= args["vllm_max_model_length"] < needed + 256
    assert args["vllm_gpu_memory_utilization"] == 0.3 and args["vllm_mode"] == "colocate"
    pinned = config.grpo.model_copy(update={"vllm_max_model_length": 8192})
    assert grpo_module.vllm_args(pinned, rows, tokenizer, {})["vllm_max_model_length"] == 8192
    server = config.grpo.model_copy(update={"vllm_mode": "server"})
    assert "vllm_max_model_length" not in grpo_module.vllm_args(server, rows, tokenizer, {})
    shipped = load_train_config("qwen3-8b-grpo").grpo
    assert shipped.use_vllm and shipped.vllm_gpu_memory_utilization == 0.3


def test_grpo_with_vllm_refuses_a_vllm_trl_does_not_support(tmp_path, monkeypatch):
    """TRL 1.16 samples with vLLM 0.22-0.31; `pyproject` allowed any vLLM >= 0.12. Refused
    before any work, naming the range and the extra that installs it."""
    from importlib import metadata

    config = load_train_config(train_yaml(tmp_path, grpo={"use_vllm": True}))
    real_version = metadata.version

    def version(found: str | None):  # type: ignore[no-untyped-def]
        def fake(dist: str) -> str:
            if dist != "vllm":
                return real_version(dist)
            if found is None:
                raise metadata.PackageNotFoundError(dist)
            return found

        return fake

    for found, said in ((None, "none is installed"), ("0.12.0", "it has 0.12.0")):
        monkeypatch.setattr(metadata, "version", version(found))
        with pytest.raises(GrpoError, match=rf">= 0.22, < 0.32.*{said}.*train-vllm"):
            grpo_module.require_trl_vllm(config)
    for found in ("0.22.0", "0.31.2+cu128"):
        monkeypatch.setattr(metadata, "version", version(found))
        grpo_module.require_trl_vllm(config)
