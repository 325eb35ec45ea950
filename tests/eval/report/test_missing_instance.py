"""An instance the run's config names but no record holds (its shard's files lost) is left
out of the paired tables like any other, and listed with why, never silently dropped."""

from __future__ import annotations

import json
from pathlib import Path

from cts.eval.data.dataset import load_instances
from cts.eval.data.schema import Record
from cts.eval.report.diagnostics import paired_instances, score_records, summarize
from cts.eval.report.report import write_report
from cts.eval.run.config import load_experiment
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import RunDir, Shard
from cts.foundation.yaml_config import Override

CONDITIONS = ["blurred", "oracle"]


def _scored(instance: str, condition: str, score: float) -> Record:
    scores = {"restore_score_100": score, "strict": score / 2, "unweighted": score}
    return Record(instance_id=instance, condition=condition, seed=0, scores=scores)


def test_an_instance_without_any_record_is_counted_and_listed():
    records = [_scored("a", c, 10.0) for c in CONDITIONS] + [
        _scored("b", c, 30.0) for c in CONDITIONS
    ]
    scored = score_records(records, CONDITIONS, [0], "exclude", ["a", "b", "c"])
    ids = paired_instances([(scored, CONDITIONS)])
    summary = summarize(records, CONDITIONS, [0], ids, scored)
    assert ids == ["a", "b"]
    assert summary["instances"] == 3 and summary["paired_instances"] == 2
    assert summary["excluded_instances"] == {
        "c": ["blurred seed 0: no record", "oracle seed 0: no record"]
    }
    # The numbers stand on a and b only: (10 + 30) / 2.
    assert summary["scores"]["blurred"]["restore_score_100"]["mean"] == 20.0


def test_without_the_configured_instances_nothing_changes():
    records = [_scored("a", c, 10.0) for c in CONDITIONS]
    alone = score_records(records, CONDITIONS, [0], "exclude")
    named = score_records(records, CONDITIONS, [0], "exclude", ["a"])
    assert alone == named
    assert summarize(records, CONDITIONS, [0], ["a"], alone)["instances"] == 1


def test_the_report_of_a_run_lists_its_instance_without_records(tmp_path: Path):
    run_dir, out = tmp_path / "run", tmp_path / "report"
    resolved = load_experiment(
        "quickstart",
        [
            Override(("conditions",), CONDITIONS),
            Override(("dataset", "limit"), 3),
            Override(("seeds",), [0]),
        ],
    )
    RunDir(run_dir).write_config(resolved)
    store = RecordStore(run_dir)
    first, second, third = [i.id for i in load_instances(resolved.experiment.dataset)]
    for instance, score in ((first, 10.0), (second, 30.0)):
        for condition in CONDITIONS:
            store.append(_scored(instance, condition, score), Shard())
    write_report([run_dir], out)
    (system,) = json.loads((out / "summary.json").read_text())["systems"].values()
    assert system["instances"] == 3 and system["paired_instances"] == 2
    assert system["excluded_instances"] == {
        third: ["blurred seed 0: no record", "oracle seed 0: no record"]
    }
    assert "3 instances (2 paired, 1 excluded)" in (out / "report.md").read_text()
