"""Which trace is fsync'd (cts/eval/run/pipeline.py `_write_trace`): a golden key's, the evidence
its nuggets cite, and not an evaluation key's, whose readers take a trace lost to a power loss
(missing, or empty) as no trace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import cts.foundation.disk
from cts.eval.data.golden import GOLDEN
from cts.eval.data.schema import Record
from cts.eval.pilot_records import read_traces
from cts.eval.run.pipeline import _write_trace
from cts.eval.run.run_dir import RunDir
from cts.eval.viewer.runs import ViewRun
from cts.foundation.disk import write_whole


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(cts.foundation.disk.os, "fsync", counted)
    return calls


def test_a_file_written_not_durable_is_whole_without_an_fsync(tmp_path: Path, fsyncs: list[int]):
    write_whole(tmp_path / "a.json", '{"a": 1}', durable=False)
    assert fsyncs == [] and (tmp_path / "a.json").read_text() == '{"a": 1}'
    write_whole(tmp_path / "a.json", '{"a": 2}')
    assert len(fsyncs) == 1 and (tmp_path / "a.json").read_text() == '{"a": 2}'
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # no temporary left


def test_only_a_golden_keys_trace_is_fsynced(tmp_path: Path, fsyncs: list[int]):
    for condition in ("blurred", "clarify@2", "oracle"):
        name = _write_trace(tmp_path, Record(instance_id="q1", condition=condition, seed=0), {})
        assert (tmp_path / name).read_text() == "{}"
    assert fsyncs == []
    _write_trace(tmp_path, Record(instance_id="q1", condition=GOLDEN, seed=1000), {})
    assert len(fsyncs) == 1


def test_a_trace_lost_to_a_power_loss_is_read_as_no_trace(tmp_path: Path):
    traces = RunDir(tmp_path).traces
    (traces / "blurred").mkdir(parents=True)
    (traces / "blurred" / "empty.json").write_text("")  # the rename survived, the data not
    (traces / "blurred" / "kept.json").write_text('{"steps": []}')
    records = [
        Record(instance_id=i, condition="blurred", seed=0, trace_id=f"blurred/{i}.json")
        for i in ("empty", "kept", "missing")
    ]
    found, unread = read_traces(tmp_path, records)
    assert list(found) == ["blurred/kept.json"] and unread == 2
    view = ViewRun(0, tmp_path, "run", None, {})
    loaded, error = view.trace(records[0])
    assert loaded is None and error and error.startswith("trace file unreadable")
    assert view.trace(records[1]) == ({"steps": []}, None)
    assert view.trace(records[2]) == (None, "trace file missing: traces/blurred/missing.json")
