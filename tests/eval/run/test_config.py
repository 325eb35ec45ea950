from __future__ import annotations

from pathlib import Path

import pytest

from cts.configs import CONFIG_DIR
from cts.eval.run.config import load_experiment
from cts.foundation.yaml_config import ConfigError
from cts.serving.model_config import load_model_config


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's own config tree: experiments/ beside models/."""
    write(
        tmp_path / "models" / "mine.yaml",
        "name: mine\npath: /ckpt/mine\nengine: openai\nendpoint: http://127.0.0.1:9/v1\n",
    )
    write(
        tmp_path / "experiments" / "exp.yaml",
        (
            "name: exp\n"
            "roles:\n"
            "  clarifier: {model: mine}\n"
            "  judge: {model: smollm2-135m-instruct}\n"
        ),
    )
    return tmp_path


def test_every_shipped_config_loads():
    for file in (CONFIG_DIR / "models").glob("*.yaml"):
        load_model_config(file)
    for file in (CONFIG_DIR / "experiments").glob("*.yaml"):
        load_experiment(file)


def test_default_is_the_quickstart():
    resolved = load_experiment()
    assert resolved.experiment.name == "quickstart"
    assert resolved.model_for("clarifier").path == "tiny:smollm2-135m-instruct"


def test_models_resolve_from_sibling_folder_then_shipped(project):
    resolved = load_experiment(project / "experiments" / "exp.yaml")
    assert resolved.model_for("clarifier").path == "/ckpt/mine"
    assert resolved.model_files["smollm2-135m-instruct"] == (
        CONFIG_DIR / "models" / "smollm2-135m-instruct.yaml"
    )


def test_swapping_a_checkpoint_is_one_line(project):
    exp = project / "experiments" / "exp.yaml"
    exp.write_text(
        exp.read_text().replace(
            "clarifier: {model: mine}", "clarifier: {model: smollm2-135m-instruct}"
        )
    )
    assert load_experiment(exp).model_for("clarifier").name == "smollm2-135m-instruct"
    # … or on the command line, without touching the file.
    resolved = load_experiment(exp, ["roles.judge.model=mine"])
    assert resolved.model_for("judge").path == "/ckpt/mine"


def test_set_overrides_parse_yaml_values():
    resolved = load_experiment(
        None, ["seeds=[1, 2]", "dataset.limit=5", "models.smollm2-135m-instruct.dtype=float32"]
    )
    assert resolved.experiment.seeds == [1, 2]
    assert resolved.experiment.dataset.limit == 5
    assert resolved.model_for("summarizer").dtype == "float32"
    assert resolved.model_for("summarizer").engine == "transformers"  # the rest of the file stays


def test_role_sampling_overrides_model_defaults():
    resolved = load_experiment(None, ["roles.clarifier.sampling.temperature=0.7"])
    assert resolved.sampling_for("clarifier").temperature == 0.7
    assert resolved.sampling_for("judge").temperature == 0.0
    assert resolved.configured_sampling("judge", max_tokens=9).max_tokens == 9
    # The role's own needs win over the config: the judge's room for a batch of labels.
    assert resolved.sampling_for("judge").max_tokens == 1024


def test_a_role_override_its_own_needs_replace_is_named_with_the_value_used():
    resolved = load_experiment(
        None,
        [
            "roles.judge.sampling.temperature=0.7",
            "roles.clarifier.sampling.max_tokens=20",
            "roles.clarifier.sampling.temperature=0.9",  # used: the clarifier may sample
            "roles.rewriter.sampling.top_p=0.5",  # used
            "roles.judge.sampling.max_tokens=1024",  # what the judge uses anyway
        ],
    )
    assert resolved.unused_sampling() == [
        "roles.clarifier.sampling.max_tokens=20 is not used: the clarifier's requests use 96 "
        "(the room the role's output schema needs, so an answer is never cut off)",
        "roles.judge.sampling.temperature=0.7 is not used: the judge's requests use 0.0 (the "
        "role samples greedily, so its outputs reproduce)",
    ]
    assert load_experiment(None, []).unused_sampling() == []


def refused(project: Path, text: str) -> tuple[Path, str]:
    """Experiment `text` written to the project's experiments/bad.yaml and loaded: the file and
    the ConfigError it must be refused with."""
    exp = write(project / "experiments" / "bad.yaml", text)
    with pytest.raises(ConfigError) as e:
        load_experiment(exp)
    return exp, str(e.value)


def test_unknown_key_names_file_line_and_key(project):
    exp, error = refused(
        project, "name: bad\nroles:\n  clarifier: {model: mine}\nbudgets:\n  max_question: 2\n"
    )
    assert error == f"{exp}:5: budgets.max_question: unknown key"


def test_wrong_type_names_file_line_and_key(project):
    exp, error = refused(
        project, "name: bad\nroles:\n  clarifier: {model: mine}\nconcurrency: lots\n"
    )
    assert error.startswith(f"{exp}:4: concurrency: Input should be a valid integer")


def test_unknown_role_is_an_error(project):
    exp = write(project / "experiments" / "bad.yaml", "name: bad\nroles:\n  oracle: {model: x}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:3: roles.oracle: Input should be"):
        load_experiment(exp)


def test_errors_in_a_model_file_name_that_file(project):
    write(project / "models" / "mine.yaml", "name: mine\npath: /x\nengine: tgi\n")
    with pytest.raises(ConfigError) as e:
        load_experiment(project / "experiments" / "exp.yaml")
    assert str(e.value).startswith(f"{project / 'models' / 'mine.yaml'}:3: engine: Input should")


def test_missing_files_are_named(project):
    with pytest.raises(ConfigError, match=r"nope.yaml: config file not found"):
        load_experiment(project / "nope.yaml")
    exp = write(
        project / "experiments" / "bad.yaml",
        "name: bad\nroles:\n  clarifier: {model: ../models/gone.yaml}\n",
    )
    with pytest.raises(ConfigError, match=r"gone.yaml: model config file not found"):
        load_experiment(exp)
    exp.write_text("name: bad\nroles:\n  clarifier: {model: ghost}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:3: roles.clarifier.model: no model config"):
        load_experiment(exp)


def test_bad_overrides_are_named():
    with pytest.raises(ConfigError, match=r"^--set budgets.max_llm_calls: Input should be greater"):
        load_experiment(None, ["budgets.max_llm_calls=0"])
    with pytest.raises(ConfigError, match=r"^--set clarification.mode: Input should be"):
        load_experiment(None, ["clarification.mode=parallel"])
    with pytest.raises(ConfigError, match=r"^--set roles.clarifier.modle: unknown key"):
        load_experiment(None, ["roles.clarifier.modle=x"])
    with pytest.raises(ConfigError, match=r"expected KEY=VALUE"):
        load_experiment(None, ["seeds"])


def test_inline_model_override_errors_name_the_experiment(project):
    with pytest.raises(ConfigError, match=r"exp.yaml: models.mine: dtype: Input should be"):
        load_experiment(project / "experiments" / "exp.yaml", ["models.mine.dtype=fp8"])


def test_resolved_config_records_versions():
    text = load_experiment().to_yaml()
    assert "versions:" in text and "transformers:" in text and "git_sha:" in text


def test_the_llm_question_classifier_needs_its_role():
    with pytest.raises(ConfigError, match=r"roles.question_classifier is not set"):
        load_experiment(None, ["clarification.question_types=llm"])
    resolved = load_experiment(
        None,
        [
            "clarification.question_types=llm",
            "roles.question_classifier.model=smollm2-135m-instruct",
        ],
    )
    assert resolved.experiment.clarification.question_types == "llm"


def test_set_on_a_model_name_with_dots_is_refused_and_quoting_applies_it():
    """`--set models.ernie-4.5-21b-a3b.vllm.gpu_memory_utilization=0.5` used to create a bogus
    `ernie-4` entry and change nothing; it is refused with the quoted form, which applies."""
    dotted = "models.ernie-4.5-21b-a3b.vllm.gpu_memory_utilization=0.5"
    with pytest.raises(ConfigError) as refused:
        load_experiment("hard518", [dotted])
    assert "'ernie-4' names no model" in str(refused.value)
    assert """--set 'models."ernie-4.5-21b-a3b".vllm.gpu_memory_utilization=VALUE'""" in str(
        refused.value
    )
    quoted = load_experiment(
        "hard518", ['models."ernie-4.5-21b-a3b".vllm.gpu_memory_utilization=0.5']
    )
    assert quoted.model_configs["ernie-4.5-21b-a3b"].vllm.gpu_memory_utilization == 0.5
    single = load_experiment("hard518", ["models.'ernie-4.5-21b-a3b'.max_concurrency=3"])
    assert single.model_configs["ernie-4.5-21b-a3b"].max_concurrency == 3
    with pytest.raises(ConfigError, match="'nosuch' names no model"):
        load_experiment(None, ["models.nosuch.dtype=float32"])
    with pytest.raises(ConfigError, match="a quoted key must be a whole segment"):
        load_experiment(None, ['models."smollm2-135m-instruct.dtype=float32'])


def test_set_may_name_any_model_there_is(project):
    """A model no role uses yet is still a model: a config file, or the file's `models:`."""
    exp = project / "experiments" / "exp.yaml"
    assert load_experiment(exp, ["models.qwen3-8b.dtype=float32"])  # a shipped config file
    inline = write(exp.with_name("inline.yaml"), exp.read_text() + "models:\n  spare: {}\n")
    assert load_experiment(inline, ["models.spare.dtype=float32"])
    swapped = load_experiment(
        exp, ["models.other.name=o", "models.other.path=/x", "roles.judge.model=other"]
    )
    assert swapped.model_configs["other"].path == "/x"
