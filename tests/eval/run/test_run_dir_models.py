"""A run directory and the models its records were made with: the Slurm freeze of an
experiment naming model files by relative path loads anywhere, as the same experiment; a
resume is refused when a model's local content (a replay file, an adapter or checkpoint folder)
changed under an unchanged config, and accepted when only what cannot change an answer did."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from cts.eval.run.config import load_experiment
from cts.eval.run.run_dir import RunDir
from cts.foundation.yaml_config import ConfigError

ROLES = ("clarifier", "user_answerer", "rewriter", "searcher", "summarizer", "judge")


def user_tree(root: Path, searcher: str | None = None) -> Path:
    """experiments/exp.yaml naming each role's model by a relative path (`../models/x.yaml`),
    as a user's own tree does; the searcher's model config is `searcher` when given."""
    (root / "models").mkdir(parents=True)
    (root / "experiments").mkdir()
    for role in ROLES:
        text = f"name: scripted-{role}\npath: none\nengine: scripted\nscript: {role}\n"
        if role == "searcher" and searcher is not None:
            text = searcher
        (root / "models" / f"{role}.yaml").write_text(text)
    experiment = {
        "name": "exp",
        "roles": {role: {"model": f"../models/{role}.yaml"} for role in ROLES},
        "dataset": {"path": "sample", "split": "dev", "limit": 2},
        "search": {"backend": "local", "corpus": "sample"},
        "conditions": ["blurred"],
    }
    path = root / "experiments" / "exp.yaml"
    path.write_text(yaml.safe_dump(experiment))
    return path


def test_a_frozen_experiment_with_relative_model_files_loads_from_anywhere(tmp_path, monkeypatch):
    """`cts slurm submit` freezes the experiment into RUN/slurm/, far from the models/ its
    relative refs name: every array task loaded it as `model config file not found`. It loads
    as the same experiment, under the same refs, so a run started unfrozen resumes frozen."""
    resolved = load_experiment(user_tree(tmp_path / "tree"))
    run = RunDir(tmp_path / "run")
    frozen = run.freeze(resolved, run.root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # an array task's working directory, beside no models/
    again = load_experiment(frozen)
    assert again.model_configs == resolved.model_configs
    assert again.experiment.roles == resolved.experiment.roles
    assert again.system_name() == resolved.system_name()
    run.write_config(resolved)  # a local start of the run...
    run.check_resume(again)  # ...which a Slurm task resumes


def test_a_missing_relative_model_file_is_still_named(tmp_path):
    """Only a whole model under `models:` stands for a file that is gone; a partial override
    of a mistyped path says the file is missing, not which keys the override lacks."""
    path = user_tree(tmp_path)
    document = yaml.safe_load(path.read_text())
    document["roles"]["judge"]["model"] = "../models/gone.yaml"
    document["models"] = {"../models/gone.yaml": {"sampling": {"temperature": 0.5}}}
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError, match=r"gone.yaml: model config file not found"):
        load_experiment(path)


def replay_searcher(replay: Path) -> str:
    return f"name: scripted-searcher\npath: none\nengine: scripted\nreplay: {replay}\n"


def test_a_resume_with_an_edited_replay_file_is_refused(tmp_path):
    """The replay file is the model: edited between two starts, the records would hold the
    answers of two models under one config."""
    replay = tmp_path / "replay.jsonl"
    replay.write_text('{"text": "<answer>\\nMODEL A\\n</answer>"}\n')
    path = user_tree(tmp_path / "tree", replay_searcher(replay))
    run = RunDir(tmp_path / "run")
    run.write_config(load_experiment(path))
    run.check_resume(load_experiment(path))  # unchanged: resumes
    replay.write_text('{"text": "<answer>\\nMODEL B\\n</answer>"}\n')
    with pytest.raises(ConfigError, match=r"fingerprint\.model:\.\./models/searcher\.yaml:replay"):
        run.check_resume(load_experiment(path))


def adapter_folder(folder: Path, weights: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text('{"r": 8}')
    (folder / "adapter_model.safetensors").write_bytes(weights)
    (folder / "training.log").write_text("not a model file")
    return folder


def adapter_judge(adapter: Path) -> str:
    return f"name: judge-ft\npath: tiny:smollm2-135m-instruct\nadapter: {adapter}\n"


def test_an_adapter_retrained_in_place_is_refused_a_copy_is_not(tmp_path):
    """An adapter trained again into its folder keeps its file names and sizes: its weights
    differ. Times, and files that are no part of the model, change nothing."""
    adapter = adapter_folder(tmp_path / "adapter", bytes(range(256)) * 4096)  # 1 MiB
    path = user_tree(tmp_path / "tree")
    (tmp_path / "tree" / "models" / "judge.yaml").write_text(adapter_judge(adapter))
    run = RunDir(tmp_path / "run")
    run.write_config(load_experiment(path))
    os.utime(adapter / "adapter_model.safetensors", (0, 0))  # copied: another time
    (adapter / "training.log").write_text("another log")
    run.check_resume(load_experiment(path))
    weights = bytearray((adapter / "adapter_model.safetensors").read_bytes())
    weights[100] ^= 0xFF  # retrained: the same size
    (adapter / "adapter_model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(ConfigError, match=r"fingerprint\.model:\.\./models/judge\.yaml:adapter"):
        run.check_resume(load_experiment(path))


def test_a_local_checkpoint_folder_is_fingerprinted_a_hub_id_is_not(tmp_path):
    """A checkpoint folder retrained in place is refused; a hub id (pinned by `revision`, a
    model config key) has no local content to compare."""

    def started(judge_path: str, name: str) -> tuple[RunDir, Path]:
        experiment = user_tree(tmp_path / name)
        (tmp_path / name / "models" / "judge.yaml").write_text(f"name: j\npath: {judge_path}\n")
        run = RunDir(tmp_path / f"run-{name}")
        run.write_config(load_experiment(experiment))
        return run, experiment

    key = "model:../models/judge.yaml:path"
    hub, _ = started("Qwen/Qwen3-8B", "hub")
    assert not any(k.startswith("model:../models/judge.yaml") for k in hub.read_fingerprint())
    checkpoint = adapter_folder(tmp_path / "ckpt", b"weights one")
    local, experiment = started(str(checkpoint), "local")
    assert key in local.read_fingerprint()
    (checkpoint / "adapter_model.safetensors").write_bytes(b"weights two")
    with pytest.raises(ConfigError, match=f"fingerprint.{key}"):
        local.check_resume(load_experiment(experiment))


def test_a_config_yaml_without_model_fingerprints_still_resumes(tmp_path):
    """Written before the model digests: nothing to compare them with, as for any
    fingerprint one side lacks."""
    replay = tmp_path / "replay.jsonl"
    replay.write_text('{"text": "<answer>\\nMODEL A\\n</answer>"}\n')
    path = user_tree(tmp_path / "tree", replay_searcher(replay))
    run = RunDir(tmp_path / "run")
    run.write_config(load_experiment(path))
    document = yaml.safe_load(run.config.read_text())
    assert any(k.startswith("model:") for k in document["fingerprint"])
    document["fingerprint"] = {
        k: v for k, v in document["fingerprint"].items() if not k.startswith("model:")
    }
    run.config.write_text(yaml.safe_dump(document, sort_keys=False))
    replay.write_text('{"text": "<answer>\\nMODEL B\\n</answer>"}\n')
    run.check_resume(load_experiment(path))


def test_a_resume_under_other_code_is_refused_naming_the_part(tmp_path):
    """A record is made by the code as well as the config: a resume after the judge's rules,
    or the pipeline, changed would mix two kinds of records. Each part of the code that makes a
    record is digested (`fingerprint.code:*`), the edited checkout's as it is on disk; a
    config.yaml written before these digests still resumes."""
    from cts.eval.data.dataset import DatasetSource, load_instances
    from cts.eval.run.fingerprint import code_digests, fingerprint

    resolved = load_experiment(None, ["dataset.limit=2"])
    prints = fingerprint(load_instances(DatasetSource(path="sample", split="dev")))
    assert {k: prints[k] for k in code_digests()} == code_digests()
    run = RunDir(tmp_path / "run")
    run.write_config(resolved, prints)
    run.check_resume(resolved, prints)
    with pytest.raises(ConfigError, match=r'fingerprint\.code:judge: .* → "other rules"'):
        run.check_resume(resolved, {**prints, "code:judge": "other rules"})
    older = RunDir(tmp_path / "older")
    older.write_config(resolved, {k: v for k, v in prints.items() if not k.startswith("code:")})
    older.check_resume(resolved, prints)
