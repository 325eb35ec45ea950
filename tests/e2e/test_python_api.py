"""The Python API (docs/python-api.md): its notebook example, run as written on scripted
engines, gives the run `cts run` gives with the same settings (the same records, the same
summary but for the run directory's path in it); `serving_for` points an experiment at its
servers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cts.eval.experiment
from cts.cli import app
from cts.eval.experiment import serving_for
from cts.eval.run.config import load_experiment
from cts.eval.run.records import RecordStore
from cts.serving.server_group import ServeOptions
from tests.scripted_cts import scripted_engines

DOC = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"


def example() -> str:
    """The page's first Python block: run the quickstart's first two instances, then read."""
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)[0]


def comparable(run_dir: Path) -> dict:
    return {
        key: r.model_dump(exclude={"seconds"})
        for key, r in RecordStore(run_dir).completed().items()
    }


def test_the_documented_python_example_equals_the_command_line_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CTS_PROGRESS_EVERY_S", "0")
    monkeypatch.setattr(cts.eval.experiment, "open_engines", scripted_engines)
    monkeypatch.chdir(tmp_path)
    exec(compile(example(), str(DOC), "exec"), {})
    printed = capsys.readouterr().out
    api = tmp_path / "runs" / "api-demo"
    assert "blurred" in printed  # the example's own prints: the summary and the records

    cli = tmp_path / "cli"
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home-cli"))  # its own caches: no reuse
    result = CliRunner().invoke(app, ["run", "--set", "dataset.limit=2", "--output-dir", str(cli)])
    assert result.exit_code == 0, result.output
    assert len(comparable(api)) == 2 * 5  # 2 instances × the quickstart's 5 conditions
    assert comparable(api) == comparable(cli)
    summaries = [json.loads((d / "summary.json").read_text()) for d in (api, cli)]
    for summary in summaries:
        summary["report"]["runs"] = []
    assert summaries[0] == summaries[1]


def test_serving_for_points_the_experiment_at_an_endpoints_file(tmp_path: Path) -> None:
    """`serving_for` with an endpoints file (what a running `cts serve` writes): the served
    model's endpoint is the file's, nothing is started, so there is nothing to watch."""
    resolved = load_experiment("hard518", [])
    key = resolved.experiment.roles["judge"].model
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps({"models": {key: {"base_url": "http://10.0.0.7:8000/v1"}}}))
    with serving_for(resolved, ServeOptions(endpoints=endpoints), tmp_path / "logs") as ready:
        assert ready.resolved.model_configs[key].endpoint == "http://10.0.0.7:8000/v1"
        assert ready.watch is None
    assert not (tmp_path / "logs").exists()
