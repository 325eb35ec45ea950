"""A run directory is bound to what its records depend on: a resume with another judge, other
sampling, other search settings, an edited dataset or other prompts is refused with what
changed; what cannot change a record may differ."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.data.dataset import load_instances
from cts.eval.run.config import load_experiment
from cts.eval.run.fingerprint import fingerprint
from cts.eval.run.run_dir import RunDir
from cts.foundation.yaml_config import ConfigError


def _all(resolved):
    """The whole dataset, as the run fingerprints it (a resume may change the limit)."""
    return load_instances(resolved.experiment.dataset.model_copy(update={"limit": None}))


def _start(tmp_path, overrides=()):
    resolved = load_experiment("quickstart", ["search.date=2026-11-30", *overrides])
    run = RunDir(tmp_path / "run")
    run.write_config(resolved, fingerprint(_all(resolved)))
    return run, resolved


def _refusal(run, overrides, instances=None):
    resolved = load_experiment("quickstart", ["search.date=2026-11-30", *overrides])
    before = run.config.read_bytes()
    try:
        run.write_config(resolved, fingerprint(instances or _all(resolved)))
    except ConfigError as e:
        assert run.config.read_bytes() == before, "the old config must stay"
        return str(e)
    return None


def test_a_resume_with_another_judge_sampling_or_search_is_refused_with_a_diff(tmp_path):
    run, _ = _start(tmp_path)
    message = _refusal(
        run, ["roles.judge.sampling.temperature=1.5", "search.top_k=5", "budgets.max_llm_calls=4"]
    )
    assert message is not None
    assert "resuming would mix the two" in message
    assert "roles.judge.sampling.temperature: null → 1.5" in message
    assert "search.top_k: 3 → 5" in message
    assert "budgets.max_llm_calls: 3 → 4" in message
    assert "another --output-dir" in message


def test_a_resume_with_another_model_config_is_refused(tmp_path):
    run, _ = _start(tmp_path)
    ref = "smollm2-135m-instruct"
    message = _refusal(run, [f"models.{ref}.sampling.top_p=0.5"])
    assert message is not None and f"models.{ref}.sampling.top_p: 1.0 → 0.5" in message


def test_an_edited_dataset_is_refused(tmp_path):
    run, resolved = _start(tmp_path)
    instances = _all(resolved)
    edited = [instances[0].model_copy(update={"fused_query": "something else"}), *instances[1:]]
    message = _refusal(run, [], edited)
    assert message is not None and "fingerprint.dataset" in message


def test_what_cannot_change_a_record_may_change_on_resume(tmp_path):
    run, _ = _start(tmp_path)
    allowed = [
        "concurrency=1",
        "dataset.limit=2",
        "seeds=[0, 1]",
        "conditions=[blurred]",
        "search.offline=true",
        f"cache.path={tmp_path}/other.sqlite",
        "models.smollm2-135m-instruct.max_batch_size=2",
        "report.failures=zero",
    ]
    assert _refusal(run, allowed) is None


def test_a_config_yaml_written_before_fingerprints_still_resumes(tmp_path):
    run, _ = _start(tmp_path)
    document = yaml.safe_load(run.config.read_text())
    del document["fingerprint"]
    run.config.write_text(yaml.safe_dump(document))
    assert _refusal(run, []) is None
    assert "fingerprint" in yaml.safe_load(run.config.read_text())


def test_cts_run_refuses_before_loading_any_model(tmp_path):
    run, _ = _start(tmp_path)
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--output-dir",
            str(run.root),
            "--set",
            "search.date=2026-11-30",
            "--set",
            "roles.judge.sampling.temperature=1.5",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "roles.judge.sampling.temperature" in result.output
    assert not (run.root / "records").exists()


def test_a_config_yaml_written_before_an_option_existed_resumes_at_its_default(tmp_path):
    """Keys this version added (here `judge.shuffle`, `judge.batch_size`) are absent from an
    older config.yaml; at their defaults they keep the old behaviour, so the run resumes.
    Set to anything else, the resume is refused as any change is."""
    run, _ = _start(tmp_path)
    document = yaml.safe_load(run.config.read_text())
    del document["experiment"]["judge"]["shuffle"]
    del document["experiment"]["judge"]["batch_size"]
    del document["models"]["smollm2-135m-instruct"]["max_retries"]  # a free key, too
    run.config.write_text(yaml.safe_dump(document))
    assert _refusal(run, []) is None
    run.config.write_text(yaml.safe_dump(document))
    refusal = _refusal(run, ["judge.shuffle=true"])
    assert refusal is not None and "judge.shuffle: false → true" in refusal
