"""A run resumed with fewer instances, seeds or conditions: its report stands on what its
config.yaml names (n, pairing and every diagnostic), and lists the stored records it ignored,
with counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cts.eval.experiment
from cts.cli import app
from cts.eval.data.schema import Record
from cts.eval.run.scope import ignored_note, in_scope
from tests.scripted_cts import scripted_engines

runner = CliRunner()


@pytest.fixture
def scripted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CTS_PROGRESS_EVERY_S", "0")
    monkeypatch.setattr(cts.eval.experiment, "open_engines", scripted_engines)
    return tmp_path


def test_a_narrowed_resume_reports_what_its_config_names_and_what_it_ignored(scripted):
    run = scripted / "run"
    common = ["--output-dir", str(run), "--set", "search.date=2026-11-30"]
    wide = ["--limit", "3", "--set", "seeds=[0,1]"]
    wide += ["--set", "conditions=[blurred,clarify@1,clarify@2,oracle]"]
    first = runner.invoke(app, ["run", *common, *wide])
    assert first.exit_code == 0, first.output
    stored = sum(1 for p in (run / "records").rglob("shard-*.jsonl") for _ in p.open())
    assert stored == 3 * 2 * 4
    narrow = [
        "--limit",
        "2",
        "--set",
        "seeds=[0]",
        "--set",
        "conditions=[blurred,clarify@1,oracle]",
    ]
    second = runner.invoke(app, ["run", *common, *narrow])
    assert second.exit_code == 0, second.output
    assert "6/6 done" in second.output

    summary = json.loads((run / "summary.json").read_text())
    (system,) = summary["systems"].values()
    # What config.yaml names: 2 instances × 3 conditions × seed 0.
    assert system["records"] == 6 and system["instances"] == 2 and system["seeds"] == [0]
    assert summary["report"]["paired_instances"] == 2
    assert all(system["scores"][c]["n"] == 2 for c in ("blurred", "clarify@1", "oracle"))
    clarification = system["clarification"]
    assert list(clarification["answerability_per_k"]) == ["1"]
    assert clarification["answerability_per_k"]["1"]["n"] == 2  # clarify@1 × 2 instances × 1 seed
    assert set(system["reuse"]) == {"blurred", "clarify@1", "oracle"}
    # And what it left out: clarify@2 (3 instances × 2 seeds), seed 1 of the other conditions
    # (3 × 3), the third instance under seed 0 (3 conditions).
    assert system["ignored_records"] == {
        "total": 18,
        "by_condition": {"clarify@2": 6},
        "by_seed": {"1": 9},
        "beyond_limit": 3,
        "instances_checked": True,
    }
    report = (run / "report.md").read_text()
    assert "18 stored record(s) are outside what config.yaml names and are ignored" in report
    assert "condition clarify@2: 6; seed 1: 9; instances beyond dataset.limit: 3" in report
    assert "18 stored record(s)" in second.output  # `cts run` prints it after the table


def _record(instance: str, condition: str, seed: int) -> Record:
    return Record(instance_id=instance, condition=condition, seed=seed)


def test_each_record_outside_is_counted_once_by_its_first_reason():
    records = [
        _record("q1", "blurred", 0),
        _record("q1", "clarify@3", 1),  # condition first, though its seed is out too
        _record("q1", "blurred", 1),
        _record("q9", "blurred", 0),
        _record("q9", "blurred", 1),  # seed before instance
    ]
    scoped = in_scope(records, ["blurred"], [0], beyond_limit=["q9"])
    assert [r.key for r in scoped.records] == [("q1", "blurred", 0)]
    assert scoped.as_dict() == {
        "total": 4,
        "by_condition": {"clarify@3": 1},
        "by_seed": {"1": 2},
        "beyond_limit": 1,
        "instances_checked": True,
    }
    unchecked = in_scope(records, ["blurred"], [0], None)
    assert len(unchecked.records) == 2 and not unchecked.instances_checked
    assert "could not be told apart" in (ignored_note("x", unchecked.as_dict()) or "")
    assert ignored_note("x", in_scope(records[:1], ["blurred"], [0], ["q9"]).as_dict()) is None
