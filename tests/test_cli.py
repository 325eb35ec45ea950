"""The `cts` command as a user runs it."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from cts.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps tables at 80 columns otherwise


def cts(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_help_lists_every_command():
    out = cts("--help").output
    for command in ("run", "models", "config"):
        assert command in out
    models = cts("models", "--help").output
    for command in ("prepare-tiny", "list", "check"):
        assert command in models


def test_config_show_prints_the_resolved_config():
    result = cts("config", "show", "--set", "roles.clarifier.sampling.temperature=0.7")
    assert result.exit_code == 0
    doc = yaml.safe_load(result.output)
    assert doc["experiment"]["roles"]["clarifier"]["sampling"] == {"temperature": 0.7}
    assert doc["models"]["smollm2-135m-instruct"]["engine"] == "transformers"
    assert doc["sources"]["experiment"].endswith("quickstart.yaml")


def test_config_errors_exit_2_and_name_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nroles:\n  clarifier: {model: smollm2-135m-instruct}\nseeds: zero\n")
    result = runner.invoke(app, ["config", "show", "--config", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}:4: seeds: Input should be a valid list" in result.output


def test_models_list_shows_shipped_configs():
    out = cts("models", "list").output
    assert "smollm2-135m-instruct" in out and "transformers" in out and "openai" in out


@pytest.mark.slow
def test_models_check_prints_answer_and_speed(tiny_path):
    result = cts("models", "check", "--role", "judge", "--structured")
    assert result.exit_code == 0, result.output
    assert "question" in result.output and "tok/s" in result.output


def test_models_check_unknown_role():
    result = runner.invoke(app, ["models", "check", "--role", "oracle"])
    assert result.exit_code == 2 and "unknown role 'oracle'" in result.output


@pytest.mark.slow
def test_run_writes_the_run_dir_and_a_rerun_is_free(tmp_path, tiny_path):
    out = tmp_path / "run"
    args = ["run", "--output-dir", str(out), "--set", f"cache.path={tmp_path / 'c.sqlite'}"]
    first = cts(*args)
    assert first.exit_code == 0, first.output
    assert {p.name for p in out.iterdir()} == {"config.yaml", "model_check.jsonl", "summary.json"}
    (check,) = [json.loads(line) for line in (out / "model_check.jsonl").read_text().splitlines()]
    assert check["error"] is None and check["parsed"]["question"]
    assert set(check["roles"]) == {
        "clarifier",
        "user_answerer",
        "rewriter",
        "searcher",
        "summarizer",
        "judge",
    }
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engines"]["models"]["smollm2-135m-instruct"]["calls"] == 1

    second = cts(*args)
    assert second.exit_code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engines"]["models"]["smollm2-135m-instruct"]["calls"] == 0
    assert summary["engines"]["cache"] == {"hits": 1, "misses": 0}
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["versions"]["torch"].startswith("2.")
