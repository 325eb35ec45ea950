"""`cts view` over a narrowed run (resumed with fewer instances, seeds or conditions): its
records are tagged and counted as the report counts them (cts/eval/run/scope.py), and a record
of an instance past `dataset.limit` still shows that instance. And a trace step whose fields
have the wrong shape is answered, not a 500."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Instance, Record
from cts.eval.report.report import load_run as report_load_run
from cts.eval.run.config import load_experiment
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import RunDir, Shard
from cts.eval.run.scope import in_scope
from cts.eval.viewer.app import make_app
from cts.eval.viewer.index import parse_query
from cts.eval.viewer.listen import allowed_hosts
from cts.eval.viewer.trace import observation
from cts.eval.viewer.view import Viewer
from tests.eval.viewer.test_view import LOCAL, a_trace, sample_of

#: What config.yaml names after the narrowing resume; the records hold more.
NARROWED = ["dataset.limit=2", "seeds=[0]", "conditions=[blurred, clarify@1]"]
STORED_CONDITIONS = ("blurred", "clarify@1", "oracle")


def narrowed_run(root: Path) -> tuple[list[Instance], list[Record]]:
    """Three instances × three conditions × seeds 0 and 1 stored (18 records), of which
    config.yaml names two instances × two conditions × seed 0 (4 records)."""
    RunDir(root).write_config(load_experiment("quickstart", NARROWED))
    instances = load_instances(DatasetSource(path="sample", split="dev", limit=3))
    records = [
        Record(
            instance_id=instance.id,
            condition=condition,
            seed=seed,
            answer=f"answer {n}",
            scores={"restore_score_100": float(n)},
        )
        for n, (instance, condition, seed) in enumerate(
            (i, c, s) for i in instances for c in STORED_CONDITIONS for s in (0, 1)
        )
    ]
    for record in records:
        RecordStore(root).append(record, Shard())
    return instances, records


@pytest.fixture
def narrowed(tmp_path: Path) -> Iterator[tuple[TestClient, Viewer, list[Instance], Path]]:
    root = tmp_path / "run"
    instances, _ = narrowed_run(root)
    viewer = Viewer([root])
    with TestClient(make_app(viewer, allowed_hosts("127.0.0.1")), LOCAL) as c:
        yield c, viewer, instances, root


# By hand: oracle is no longer a condition (3 instances × 2 seeds = 6); seed 1 of the two kept
# conditions (3 × 2 = 6); the third instance is past dataset.limit (seed 0, 2 conditions = 2).
IGNORED = {
    "total": 14,
    "by_condition": {"oracle": 6},
    "by_seed": {"1": 6},
    "beyond_limit": 2,
    "instances_checked": True,
}


def test_runs_count_the_records_outside_config_yaml_as_the_report_does(narrowed):
    client, viewer, _, root = narrowed
    (described,) = client.get("/api/runs").json()["runs"]
    assert (described["records"], described["stored"], described["failed"]) == (4, 18, 0)
    assert described["ignored"] == IGNORED
    # The report's own account of the same run (the fields the viewer gives), and the scope
    # check it stands on.
    reported = report_load_run(root).ignored
    assert {k: reported[k] for k in IGNORED} == IGNORED
    experiment = load_experiment("quickstart", NARROWED).experiment
    third = load_instances(DatasetSource(path="sample", split="dev", limit=3))[2].id
    records = viewer.runs[0].records.values()
    scoped = in_scope(records, experiment.conditions, experiment.seeds, [third])
    rows = viewer.index(parse_query({"limit": ["500"]}))["rows"]
    tagged = {(r["instance_id"], r["condition"], r["seed"]) for r in rows}
    assert tagged == {r.key for r in scoped.records}


def test_the_index_lists_what_the_report_uses_and_the_rest_on_asking(narrowed):
    client, _, instances, _ = narrowed

    def keys(**params: Any) -> set[tuple[str, str, int, bool]]:
        response = client.get("/api/records", params={"limit": 500, **params})
        assert response.status_code == 200, response.text
        found = response.json()
        assert found["total"] == len(found["rows"])
        return {(r["instance_id"], r["condition"], r["seed"], r["in_scope"]) for r in found["rows"]}

    kept = {(i.id, c, 0, True) for i in instances[:2] for c in ("blurred", "clarify@1")}
    assert keys() == kept == keys(scope="in")
    outside = keys(scope="out")
    assert len(outside) == 14 and not any(tag for *_, tag in outside)
    assert keys(scope="all") == kept | outside
    response = client.get("/api/records", params={"scope": "some"})
    assert response.status_code == 400 and response.json()["error"].startswith("scope:")
    # Comparing across keys still offers every stored record, each tagged.
    listed = client.get("/api/instance", params={"instance": instances[0].id}).json()["records"]
    assert sorted(r["in_scope"] for r in listed) == [False] * 4 + [True] * 2


def test_a_record_past_dataset_limit_shows_its_instance_and_nuggets(narrowed):
    client, _, instances, _ = narrowed
    beyond = instances[2]
    record = Record(instance_id=beyond.id, condition="blurred", seed=0)
    sample = sample_of(client, record)
    assert sample["instance_error"] is None
    assert sample["instance"]["fused_query"] == beyond.fused_query
    assert sample["instance"]["blurred_query"] == beyond.blurred_query
    assert beyond.golden is not None
    assert [(n["text"], n["weight"]) for n in sample["nuggets"]] == [
        (n.text, n.weight) for n in beyond.golden.nuggets
    ]
    assert sample["in_scope"] is False
    assert "beyond dataset.limit" in sample["scope_note"]
    oracle = sample_of(client, Record(instance_id=instances[0].id, condition="oracle", seed=0))
    assert oracle["in_scope"] is False and "condition oracle" in oracle["scope_note"]
    kept = sample_of(client, Record(instance_id=instances[0].id, condition="blurred", seed=0))
    assert kept["in_scope"] is True and kept["scope_note"] is None


# -- a trace step of the wrong shape ----------------------------------------------------------


VISIT_TEXT = (
    "The useful information in u for user goal g as follows: \n\nEvidence in page: \ne"
    "\n\nSummary: \ns"
)
MALFORMED_STEPS = [
    {"kind": "tool", "tool": "search", "result": "x", "evidence": 5},
    {"kind": "tool", "tool": "visit", "result": VISIT_TEXT, "errors": ["oops"], "evidence": []},
    {"kind": "tool", "tool": "visit", "result": VISIT_TEXT, "evidence": [{"url": ["u"]}]},
    {"kind": "tool", "tool": "search", "result": "x", "evidence": "A-0003"},
]


@pytest.mark.parametrize("step", MALFORMED_STEPS, ids=lambda s: json.dumps(s)[-40:])
def test_a_step_field_of_the_wrong_shape_is_named_not_raised(step):
    shown = observation(step)
    assert shown["malformed"] and shown["errors"] == {}
    for page in shown.get("pages", []):
        assert page["doc_id"] is None and page["error"] is None


def test_a_sample_whose_trace_has_malformed_steps_is_answered_with_trace_error(tmp_path):
    root = tmp_path / "run"
    RunDir(root).write_config(load_experiment("quickstart", ["dataset.limit=1", "seeds=[0]"]))
    trace = a_trace("an answer")
    trace["steps"] = [trace["steps"][0], *MALFORMED_STEPS[:2]]
    RunDir(root).traces.mkdir(parents=True)
    (RunDir(root).traces / "odd.json").write_text(json.dumps(trace))
    (instance,) = load_instances(DatasetSource(path="sample", split="dev", limit=1))
    record = Record(instance_id=instance.id, condition="blurred", seed=0, trace_id="odd.json")
    RecordStore(root).append(record, Shard())
    with TestClient(make_app(Viewer([root]), allowed_hosts("127.0.0.1")), LOCAL) as c:
        sample = sample_of(c, record)
    first, second = sample["trace"]["turns"]
    assert first["observation"]["searches"][0]["hits"] == []
    assert second["observation"]["pages"][0]["evidence"] == "e"
    assert sample["trace_error"] == (
        "malformed trace steps (shown without them): turn 1: evidence: expected a list, got "
        "int; turn 2: errors: expected an object, got list"
    )
