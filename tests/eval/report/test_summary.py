"""summary.json through its type (cts/eval/report/summary.py): the file `cts report` writes reads
back to the same bytes, a Python user gets typed fields, and a broken file is an error naming
the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cts.eval.experiment
from cts.eval.experiment import run_experiment
from cts.eval.report.report import write_report
from cts.eval.report.summary import Summary, SummaryError, read_summary
from cts.eval.run.config import load_experiment
from tests.scripted_cts import scripted_engines


@pytest.fixture
def two_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Path], Path]:
    """The quickstart on 3 instances, twice, every role scripted; their report together."""
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(cts.eval.experiment, "open_engines", scripted_engines)
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        resolved = load_experiment(None, ["dataset.limit=3", "conditions=[blurred,clarify@1]"])
        run_experiment(resolved, run, show_progress=False)
    write_report(runs, tmp_path / "report")
    return runs, tmp_path / "report" / "summary.json"


def test_a_written_summary_reads_back_typed_and_writes_the_same_bytes(two_runs, tmp_path):
    runs, path = two_runs
    summary = read_summary(path)
    assert summary.report.runs == [str(r) for r in runs]
    assert summary.report.paired_instances == 3
    (first, second) = summary.systems
    assert summary.systems[first].instances == 3
    blurred = summary.systems[first].score("blurred")
    assert blurred is not None and blurred.n == 3 and blurred.low <= blurred.mean <= blurred.high
    assert summary.systems[first].gain("blurred") is None  # blurred is what gains are over
    assert summary.systems[first].gain("oracle") is None  # not run
    gain = summary.systems[first].gain("clarify@1")
    assert gain is not None and gain.n == 3 and gain.gain_recovered is None  # no oracle to share
    assert gain.gain_over_blurred == summary.systems[first].gains["clarify@1"]["gain_over_blurred"]
    row = summary.comparison(first, second, "blurred")
    assert row is not None and row.n == 3 and row.difference == 0.0  # the same run twice
    assert summary.comparison(second, first, "blurred") is None  # a − b, in the report's order
    copy = tmp_path / "summary.json"
    summary.write(copy)
    assert copy.read_bytes() == path.read_bytes()
    # What `cts.report` returns is the summary it wrote, typed.
    again = write_report(runs, tmp_path / "again")
    assert again.summary_json.read_bytes() == path.read_bytes() and again.summary == summary


def test_an_older_summary_without_the_later_fields_still_reads(two_runs):
    document = json.loads(two_runs[1].read_text())
    for system in document["systems"].values():
        del system["oracle_independence"], system["ignored_records"]
    older = Summary.model_validate(document)
    assert all(s.oracle_independence is None for s in older.systems.values())


def test_a_broken_summary_names_the_file_and_the_field(two_runs, tmp_path):
    document = json.loads(two_runs[1].read_text())
    first = next(iter(document["systems"]))
    document["systems"][first]["records"] = "many"
    broken = tmp_path / "summary.json"
    broken.write_text(json.dumps(document))
    with pytest.raises(SummaryError) as e:
        read_summary(broken)
    assert str(e.value).startswith(f"{broken}: systems.{first}.records: ")
    assert "valid integer" in str(e.value)
