"""A loop whose clarifier is served by vLLM keeps every iteration as a LoRA adapter on the base's
one server (`lora_of`), each fitted on top of the one before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from cts.cli import app
from cts.configs import CONFIG_DIR
from cts.serving.server_plan import plan_servers
from cts.train.config import TrainConfig, load_train_config
from cts.train.fit import base_model, lora_base, result_config, write_model_config
from cts.train.loop import LoopError, evaluation, iterations

SERVED = "smollm2-135m-instruct-vllm"
ADAPTERS = CONFIG_DIR / "models" / "adapters"
QUICKSTART_CLARIFIER = "clarifier: {model: smollm2-135m-instruct}"


def train_yaml(tmp_path: Path, clarifier: str, **extra: object) -> TrainConfig:
    """A loop on the quickstart whose clarifier (sampled, fitted and evaluated) is `clarifier`."""
    experiment = tmp_path / "experiments" / "loop.yaml"
    experiment.parent.mkdir(exist_ok=True)
    quickstart = (CONFIG_DIR / "experiments" / "quickstart.yaml").read_text()
    assert QUICKSTART_CLARIFIER in quickstart
    experiment.write_text(
        quickstart.replace(QUICKSTART_CLARIFIER, f"clarifier: {{model: {clarifier}}}")
    )
    path = tmp_path / "train.yaml"
    doc = {
        "name": "t",
        "experiment": str(experiment),
        "split": "train",
        "candidates": 2,
        "merge": False,
        "output_dir": str(tmp_path / "out"),
        **extra,
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_train_config(path)


def fitted(train: TrainConfig, adapter: str) -> Path:
    """What `fit` leaves for an iteration (its adapter and clarifier.yaml), with a shipped
    adapter standing in for the trained weights."""
    out = train.resolved_output_dir()
    shutil.copytree(ADAPTERS / adapter, out / "adapter")
    key, base = base_model(train)
    config = result_config(train, base, f"{key}-{train.name}", out)
    return write_model_config(config, base, train, out, train.method)


def lora_modules(args: list[str]) -> list[str]:
    return args[args.index("--lora-modules") + 1 :]


def test_every_iteration_is_an_adapter_on_the_base_server(tmp_path):
    config = train_yaml(tmp_path, SERVED)
    loop = iterations(config, 2)  # merge: false is fine on a served base
    assert lora_base(config) == SERVED
    first = fitted(loop[1].train, "smollm2-135m-rewriter")
    written = yaml.safe_load(first.read_text())
    assert written["lora_of"] == SERVED and written["engine"] == "openai"
    assert written["adapter"] == str((tmp_path / "out" / "iter-1" / "adapter").resolve())
    # Iteration 2 trains on iteration 1's adapter and hangs on the same base, not on iteration 1.
    assert lora_base(loop[2].train) == SERVED
    assert base_model(loop[2].train)[1].resolved_adapter() == written["adapter"]
    second = fitted(loop[2].train, "smollm2-135m-answerer")
    assert yaml.safe_load(second.read_text())["lora_of"] == SERVED

    # Iteration 2's evaluation: one vLLM server (the base), iteration 2's adapter on it.
    resolved = evaluation(config, loop[2], "main")
    (server,) = plan_servers(resolved.model_configs, tmp_path, cpu=True, python="/p")
    assert [m.split("=")[0] for m in lora_modules(server.server.args)] == [
        resolved.model_for("clarifier").name
    ]
    # Every iteration on one server: the base's, with both adapters (`cts serve --adapters`).
    together = evaluation(config, loop[0], "main").with_adapters([str(first), str(second)])
    (server,) = plan_servers(together.model_configs, tmp_path, cpu=True, python="/p")
    assert len(lora_modules(server.server.args)) == 2
    assert server.server.args[server.server.args.index("--max-loras") + 1] == "2"


def test_a_base_that_is_a_yaml_path_is_named_by_its_absolute_path(tmp_path, monkeypatch):
    # Written beside the experiment file, as a relative path there reads.
    local = tmp_path / "experiments" / "served.yaml"
    config = train_yaml(tmp_path, "served.yaml")
    local.write_text((CONFIG_DIR / "models" / f"{SERVED}.yaml").read_text())
    monkeypatch.chdir("/")
    assert lora_base(config) == str(local.resolve())


def test_an_in_process_or_external_clarifier_still_needs_merged_checkpoints(tmp_path):
    with pytest.raises(LoopError, match="set merge: true"):
        iterations(train_yaml(tmp_path, "smollm2-135m-instruct"), 1)
    external = tmp_path / "external.yaml"
    model = yaml.safe_load((CONFIG_DIR / "models" / f"{SERVED}.yaml").read_text())
    external.write_text(yaml.safe_dump({**model, "vllm": {"serve": False}}))
    assert lora_base(train_yaml(tmp_path, str(external))) is None


@pytest.mark.slow
def test_a_fit_on_an_adapter_s_clarifier_goes_on_training_that_adapter(tmp_path):
    """`cts train fit` (DPO) on a clarifier that is an adapter on a served base starts from
    that adapter: at a rate too small to move the weights, the saved adapter is the one it
    started from (a fresh one's B matrices are zero), TRL's frozen reference copy is neither
    saved nor left behind, and the result hangs on the same base server."""
    start = (ADAPTERS / "smollm2-135m-rewriter").resolve()
    config = train_yaml(
        tmp_path,
        "adapter.yaml",
        method="dpo",
        learning_rate=1e-12,
        epochs=1,
        batch_size=1,
        grad_accum=1,
        max_length=128,
        gradient_checkpointing=False,
        logging_steps=1,
    )
    clarifier = {
        "name": "tiny-ft",
        "path": "tiny:smollm2-135m-instruct",
        "engine": "openai",
        "lora_of": SERVED,
        "adapter": str(start),
    }
    (tmp_path / "experiments" / "adapter.yaml").write_text(yaml.safe_dump(clarifier))
    row = {
        "prompt": [{"role": "user", "content": "Ask one question about: train tickets"}],
        "chosen": [{"role": "assistant", "content": "Which date do you travel?"}],
        "rejected": [{"role": "assistant", "content": "Why?"}],
    }
    config.data_file().parent.mkdir(parents=True)
    config.data_file().write_text(json.dumps(row) + "\n")
    ran = CliRunner().invoke(app, ["train", "fit", "-c", str(tmp_path / "train.yaml")])
    assert ran.exit_code == 0, ran.output
    assert f"on {SERVED}'s own server" in " ".join(ran.output.split())
    out = config.resolved_output_dir()
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["continued_adapter"] == str(start)
    assert yaml.safe_load((out / "clarifier.yaml").read_text())["lora_of"] == SERVED
    before = load_file(start / "adapter_model.safetensors")
    after = load_file(out / "adapter" / "adapter_model.safetensors")
    assert set(after) == set(before)
    assert all(torch.allclose(after[k], before[k], atol=1e-6) for k in before)
    assert any(bool(t.abs().sum() > 0) for k, t in after.items() if "lora_B" in k)
    assert not (out / "adapter" / "ref").exists()
