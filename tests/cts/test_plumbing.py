"""The plumbing every command shares: the one config loader (where each key came from), the
run directory object, and the one mapping from domain errors to exit codes."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from cts.cli.common import EXITS, command, exit_for
from cts.cli.options import SERVING, serving
from cts.eval.data.readers import DatasetError
from cts.eval.report.report import load_run
from cts.eval.run.config import ExperimentConfig, load_experiment
from cts.eval.run.locks import ShardBusy
from cts.eval.run.records import RecordFileError
from cts.eval.run.run_dir import RunDir, RunDirError, ShardError
from cts.foundation.yaml_config import ConfigError, Override, load_config, mapping_overrides
from cts.serving.model_config import ModelConfig
from cts.serving.server_group import EndpointsError, ServeOptions, Stopped
from cts.serving.vllm_server import ServerError
from cts.train.config import load_train_config
from cts.train.sample import sampling_experiment

ROOT = Path(__file__).resolve().parents[2]
OLD_CONFIG = Path(__file__).resolve().parents[1] / "data" / "run_config_da669a7.yaml"


# -- one loader -------------------------------------------------------------------------------


def test_the_loader_says_where_each_key_came_from(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\npath: /ckpt\nsampling:\n  temperature: 0.5\n")
    loaded = load_config(
        ModelConfig,
        path,
        ["sampling.max_tokens=64", Override(("engine",), "openai", "train.yaml:3: experiment")],
    )
    assert loaded.config.sampling.max_tokens == 64 and loaded.config.engine == "openai"
    assert loaded.origins.where("sampling", "temperature") == f"{path}:4: sampling.temperature"
    # A key below a file key without its own line takes its parent's.
    assert loaded.origins.where("sampling", "top_p") == f"{path}:3: sampling.top_p"
    assert loaded.origins.where("sampling", "max_tokens") == "--set sampling.max_tokens"
    assert loaded.origins.where("engine") == "train.yaml:3: experiment engine"


def test_typed_overrides_need_no_text_round_trip(tmp_path):
    # A value that would change type if written as `--set` text and parsed back.
    path = tmp_path / "m.yaml"
    path.write_text("name: m\npath: /ckpt\n")
    loaded = load_config(ModelConfig, path, [Override(("name",), "2026-11-30")])
    assert loaded.config.name == "2026-11-30"
    with pytest.raises(ConfigError, match=r"^--set sampling.temperature: "):
        load_config(ModelConfig, path, [Override(("sampling", "temperature"), -1.0)])


def test_an_inline_model_is_laid_over_its_file_like_a_deep_merge():
    overrides = mapping_overrides({"sampling": {"temperature": 0.2}, "vllm": {}}, "exp.yaml:")
    assert [(o.keys, o.value) for o in overrides] == [(("sampling", "temperature"), 0.2)]


def test_experiments_remember_where_their_keys_came_from(tmp_path):
    resolved = load_experiment("quickstart", ["seeds=[0, 1]"])
    assert resolved.origins.where("seeds") == "--set seeds"
    assert resolved.origins.where("name").startswith(f"{resolved.path}:")
    # Kept out of the run's config.yaml.
    assert "origins" not in resolved.to_yaml()


def test_the_samples_experiment_is_built_from_typed_values():
    train = load_train_config("quickstart", ["candidates=3", "temperature=0.9"])
    experiment = sampling_experiment(train).experiment
    assert experiment.seeds == [0, 1, 2] and experiment.conditions == ["clarify@1"]
    assert experiment.roles["clarifier"].sampling.temperature == 0.9
    assert experiment.dataset.split == "train"


# -- the run directory ------------------------------------------------------------------------


def test_a_run_directory_written_before_run_dir_existed_still_reads(tmp_path):
    shutil.copy(OLD_CONFIG, tmp_path / "config.yaml")
    run = RunDir(tmp_path)
    resolved = run.read_config()
    assert isinstance(resolved.experiment, ExperimentConfig)
    assert run.system_name() == "quickstart (smollm2-135m-instruct)"
    assert load_run(tmp_path).name == run.system_name()
    assert set(resolved.model_files) == set(resolved.model_configs)


def test_a_config_written_by_a_run_reads_back_the_same(tmp_path):
    resolved = load_experiment("quickstart", ["seeds=[3]"])
    run = RunDir(tmp_path / "run")
    run.write_config(resolved)
    back = run.read_config()
    assert back.experiment == resolved.experiment
    assert back.model_configs == resolved.model_configs
    assert back.output_dir() == resolved.output_dir()
    assert back.system_name() == resolved.system_name()
    assert not list(run.root.glob("*.partial"))


def test_a_frozen_experiment_loads_as_a_config(tmp_path):
    resolved = load_experiment("quickstart")
    frozen = RunDir(tmp_path).freeze(resolved, tmp_path)
    assert frozen == tmp_path / "slurm" / "experiment.yaml"
    again = load_experiment(frozen)
    assert again.experiment.output_dir == str(tmp_path)
    assert again.model_configs == resolved.model_configs


def test_not_a_run_directory_is_a_clear_error(tmp_path):
    with pytest.raises(RunDirError, match=f"not a run directory \\(no config.yaml\\): {tmp_path}"):
        RunDir(tmp_path).read_config()


def test_a_broken_config_yaml_names_its_line(tmp_path):
    (tmp_path / "config.yaml").write_text("experiment:\n  name: x\n  roles: {}\n  seeds: nope\n")
    with pytest.raises(ConfigError, match=r"config.yaml:4: experiment.seeds"):
        RunDir(tmp_path).read_config()


# -- commands ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "start", "code"),
    [
        (ConfigError("x.yaml:3: seeds: bad"), "config error\nx.yaml:3", 2),
        (DatasetError([]), "dataset error", 2),
        (EndpointsError("e.json: not found"), "endpoints error: e.json", 2),
        (ShardError("--shard '5/2': need 0 <= I < N"), "--shard", 2),
        (RunDirError("not a run directory (no config.yaml): x"), "not a run directory", 2),
        (RecordFileError("r.jsonl:2: bad"), "records error: r.jsonl:2", 1),
        (ServerError("model judge died"), "server error: model judge died", 1),
        (ShardBusy("r/.shard-0-of-2.lock: shard 0/2 of this run is being run"), "r/.shard", 1),
        (Stopped("SIGTERM"), "SIGTERM while starting the servers", 130),
    ],
)
def test_each_domain_error_has_one_message_and_exit_code(error, start, code):
    found = exit_for(error)
    assert found is not None
    assert found[0].startswith(start) and found[1] == code


def test_an_error_that_is_not_a_domain_error_keeps_its_traceback():
    assert exit_for(KeyError("bug")) is None
    # Subclasses come after what they refine would be caught first otherwise.
    classes = [cls for cls, _, _ in EXITS]
    for i, cls in enumerate(classes):
        assert not any(issubclass(cls, earlier) for earlier in classes[:i]), cls


def test_a_command_ends_with_the_mapped_exit_code():
    app = typer.Typer()

    @command(app, "fail")
    def fail(path: str = typer.Option("x")) -> None:
        """Raise a domain error."""
        raise RecordFileError(f"{path}:1: not a record")

    @command(app, "other")
    def other() -> None:
        pass

    result = CliRunner().invoke(app, ["fail", "--path", "r.jsonl"])
    assert result.exit_code == 1
    assert "records error: r.jsonl:1: not a record" in result.output


_OWN_SERVE = serving("Start only this command's server.")


def test_the_serving_options_stand_in_the_place_of_their_parameter():
    app = typer.Typer()
    got: dict[str, object] = {}

    @command(app, "go")
    def go(
        before: int = typer.Option(1, "--before"),
        options: ServeOptions = SERVING,
        after: str = typer.Option("a", "--after"),
    ) -> None:
        got.update(before=before, options=options, after=after)

    @command(app, "own")
    def own(options: ServeOptions = _OWN_SERVE) -> None:
        got.update(options=options)

    runner = CliRunner()
    args = ["--serve", "--gpus", "0,1", "--cpu", "--vllm-python", "py", "--ready-timeout", "7"]
    args += ["--endpoints-wait", "30"]
    result = runner.invoke(app, ["go", "--before", "2", *args, "--endpoints", "e.json"])
    assert result.exit_code == 0, result.output
    assert got == {
        "before": 2,
        "options": ServeOptions(Path("e.json"), True, "0,1", True, "py", 7.0, 30.0),
        "after": "a",
    }
    assert runner.invoke(app, ["own"]).exit_code == 0
    assert got["options"] == ServeOptions()
    assert runner.invoke(app, ["go", "--ready-timeout", "0"]).exit_code == 2
    flags = [o for p in typer.main.get_command(app).commands["go"].params for o in p.opts]
    assert flags[:9] == [
        "--before",
        "--endpoints",
        "--serve",
        "--gpus",
        "--cpu",
        "--vllm-python",
        "--ready-timeout",
        "--endpoints-wait",
        "--after",
    ]
    own_help = runner.invoke(app, ["own", "--help"], env={"COLUMNS": "200"}).output
    assert "Start only this command's server." in own_help


def test_only_the_command_line_package_imports_typer():
    """Only cts/cli/ speaks typer: the rest of the installed code raises domain errors and
    returns values (and a script or notebook never needs typer)."""
    offenders = []
    checked = 0
    for path in sorted((ROOT / "cts").rglob("*.py")):
        if path.relative_to(ROOT).parts[:2] == ("cts", "cli"):
            continue
        checked += 1
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n == "typer" or n.startswith("typer.") for n in names):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == [] and checked > 100


@pytest.mark.parametrize("retry", [True, False])
def test_the_closing_line_says_a_plain_rerun_keeps_failed_records(retry):
    """Failed records count as done: a rerun of the same command skips them. The line says so,
    and, for a command that takes it, that --retry-failed runs them again."""
    from collections import Counter

    from rich.console import Console

    from cts.cli.common import print_account
    from cts.eval.experiment import RunResult
    from cts.eval.run.run_dir import Shard
    from cts.eval.run.runner import RunOutcome

    console = Console(record=True, width=400)
    failed = RunOutcome(ran=24, failures=Counter(engine_error=8))
    result = RunResult(Path("r"), failed, 3.0, None, {}, None)
    print_account(console, result, Shard(), "cts merge r", retry=retry)
    line = console.export_text()
    assert "24 records written, 0 already done, 8 failed (engine_error 8; a plain rerun " in line
    assert ("--retry-failed runs them again" in line) is retry
    print_account(
        console, RunResult(Path("r"), RunOutcome(ran=3), 1.0, None, {}, None), Shard(), ""
    )
    assert console.export_text().startswith("3 records written, 0 already done, 0 failed; ")


def test_help_flows_and_cts_help_lists_each_command_on_one_line(monkeypatch):
    """Docstrings are hard-wrapped in the source: kept as they are, the terminal re-wrapped
    them into ragged lines ("the\\nrendered"). Each paragraph flows; a list keeps its lines;
    `cts --help` lists a command by its first sentence, cut when long."""
    from cts.cli.common import first_sentence, flowing

    doc = """Check what would break: with --slurm the version,
    the scripts and the partitions.

    - one
    - two
    """
    assert flowing(doc) == (
        "Check what would break: with --slurm the version, the scripts and the partitions."
        "\n\n- one\n- two"
    )
    assert first_sentence("Estimate a whole sweep — what `cts run -c X` would run: every "
                          "instance of the dataset × conditions × seeds — before it. More.") == (
        "Estimate a whole sweep"
    )  # fmt: skip
    monkeypatch.setenv("COLUMNS", "120")
    listed = CliRunner().invoke(app_of_cts(), ["--help"]).output
    rows = [r for r in listed.split("Commands", 1)[1].splitlines() if r.startswith("│")]
    names = [r for r in rows if re.match(r"^│ [a-z]", r)]
    assert len(names) >= 17 and len(names) == len(rows), listed


def app_of_cts() -> typer.Typer:
    from cts.cli import app

    return app
