"""Golden construction: evidence from a trace, nuggets that cite only it, the `golden` key of
the pipeline, the dataset it writes; and `cts golden build` on the tiny real model."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from cts.agents.nugget_builder import Evidence, evidence_text, nuggets_schema
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.golden import GOLDEN, golden_dataset
from cts.eval.data.schema import Nugget, Record
from cts.eval.run.golden_search import trace_evidence
from cts.eval.run.pipeline import run_instance, trace_name
from cts.webdancer.protocol import ToolCall
from tests.scripted import scripted_context

SENTINEL = "SENTINEL-golden-4c1e"


def instances(n: int = 2):
    return load_instances(DatasetSource(path="sample", split="dev", limit=n))


def test_trace_evidence_takes_tool_observations_with_doc_ids_or_urls():
    def shown(*pairs: tuple[str, str]) -> list[dict[str, str]]:
        return [{"id": i, "url": u} for i, u in pairs]

    steps = [
        {"kind": "llm", "text": "<think>…"},
        {"kind": "tool", "result": "hits", "evidence": shown(("d1", "u1"), ("d2", "u2"))},
        {"kind": "protocol_error", "message": "bad"},
        {"kind": "tool", "result": "web", "evidence": shown(("https://a", "https://a"))},
        {"kind": "tool", "result": "[Search] Invalid request format", "evidence": []},
    ]
    evidence = trace_evidence(steps)
    assert [e.ids for e in evidence] == [("d1", "d2"), ("https://a",)]
    assert evidence[0].text == "hits"
    text = evidence_text(evidence, 10_000)
    assert "[d1] u1\n[d2] u2\nhits" in text
    assert "[https://a]\nweb" in text


def test_evidence_is_cut_to_equal_shares():
    long = Evidence(("a",), "x" * 5000)
    short = Evidence(("b",), "short page")
    text = evidence_text([long, short], 2000)
    assert "short page" in text
    assert text.count("x") == 1000


def test_the_schema_admits_only_evidence_ids_and_the_benchmark_weights():
    schema = nuggets_schema(["d1", "d2"], max_nuggets=2)
    ok = {"nuggets": [{"text": "A fact.", "weight": 3, "source_ids": ["d2"]}]}
    jsonschema.validate(ok, schema)
    for bad in (
        {"nuggets": [{"text": "A fact.", "weight": 3, "source_ids": ["d9"]}]},  # not in trace
        {"nuggets": [{"text": "A fact.", "weight": 3, "source_ids": []}]},  # cites nothing
        {"nuggets": [{"text": "A fact.", "weight": 5, "source_ids": ["d1"]}]},
        {"nuggets": []},
        {"nuggets": [{"text": "A fact.", "weight": 1, "source_ids": ["d1"]}] * 3},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_the_golden_key_searches_the_fused_query_and_cites_only_its_trace(search, tmp_path):
    ctx, roles = scripted_context(search, tmp_path / "traces")
    instance = instances(1)[0]
    instance = instance.model_copy(update={"fused_query": f"{instance.fused_query} {SENTINEL}"})
    record = asyncio.run(run_instance(instance, GOLDEN, 0, ctx))
    assert record.error is None, record.error
    assert record.search_query == instance.fused_query
    # The duplicate (same text up to case and spaces) is dropped; ids are n1..nN.
    assert [(n.id, n.text, n.weight) for n in record.nuggets] == [
        ("n1", "The first fact.", 3),
        ("n2", "A second fact.", 2),
    ]
    cited = {i for n in record.nuggets for i in n.source_ids}
    assert cited and cited <= set(record.doc_ids)
    assert len(record.nuggets[1].source_ids) == 1  # a repeated id is cited once
    assert record.trace_id == trace_name(record)
    assert record.trace_id.startswith(f"golden/{instance.id}-")
    assert (tmp_path / "traces" / record.trace_id).is_file()
    prompt = roles["nugget_builder"].requests[0].messages[-1].content
    assert SENTINEL in prompt and all(f"[{i}]" in prompt for i in record.doc_ids)
    assert not roles["clarifier"].requests and not roles["judge"].requests


def test_a_trace_without_evidence_is_a_recorded_failure(search):
    ctx, roles = scripted_context(search)
    roles["searcher"].script = lambda r: "<think>\nknown\n</think>\n<answer>\nan answer\n</answer>"
    record = asyncio.run(run_instance(instances(1)[0], GOLDEN, 0, ctx))
    assert record.error is not None and record.error["kind"] == "no_evidence"
    assert record.error["stage"] == "nuggets" and not record.nuggets
    assert not roles["nugget_builder"].requests


def test_a_nugget_citing_an_id_outside_the_trace_is_an_error_not_a_nugget(search):
    ctx, roles = scripted_context(search)
    roles["nugget_builder"].script = lambda r: json.dumps(
        {"nuggets": [{"text": "Invented.", "weight": 3, "source_ids": ["not-in-trace"]}]}
    )
    record = asyncio.run(run_instance(instances(1)[0], GOLDEN, 0, ctx))
    assert record.error is not None and record.error["stage"] == "nuggets"
    assert record.error["kind"] == "constrained_output_invalid" and not record.nuggets


def test_the_golden_dataset_keeps_order_and_lists_failures(tmp_path):
    a, b, c = instances(3)
    done = [Nugget(id="n1", text="A fact.", weight=2, source_ids=["A-0001"])]
    records = {
        a.id: Record(instance_id=a.id, condition=GOLDEN, seed=0, nuggets=done, trace_id="t/a"),
        b.id: Record(
            instance_id=b.id,
            condition=GOLDEN,
            seed=0,
            error={"kind": "no_evidence", "stage": "nuggets", "message": "nothing found"},
        ),
    }
    out = tmp_path / "dataset.jsonl"
    report = golden_dataset([a, b, c], records, out)
    assert (report.built, report.missing, list(report.failed)) == (1, [c.id], [b.id])
    assert "no_evidence: nothing found" in report.failed[b.id]
    assert not report.complete
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [a.id]
    assert rows[0]["golden"]["trace_id"] == "t/a"
    assert rows[0]["blurred_query"] == a.blurred_query
    # What it wrote is a valid dataset with the new nuggets.
    again = load_instances(DatasetSource(path=str(out)))
    assert again[0].golden is not None and again[0].golden.nuggets == done


def test_evidence_is_what_the_model_saw_not_failed_visits(search):
    ctx, _ = scripted_context(search)
    known = search.documents[0]
    call = ToolCall(
        name="visit", arguments={"url": [known.url, "https://nowhere.example/x"], "goal": "g"}
    )
    visited = asyncio.run(ctx.agent.tools.call(call))
    assert visited.urls == [known.url, "https://nowhere.example/x"]
    assert visited.evidence == [{"id": known.doc_id, "url": known.url}]
    found = asyncio.run(ctx.agent.tools.call(ToolCall(name="search", arguments={"query": ["x"]})))
    assert [e["id"] for e in found.evidence] == found.doc_ids and found.doc_ids


@pytest.mark.slow
def test_cts_golden_build_on_the_tiny_model(tmp_path, tiny_path, monkeypatch):
    """`cts golden build` as a user runs it: traces archived, a dataset whose nuggets cite
    only evidence their trace showed (and validates against the corpus), failures listed with
    why; a second build makes no model call; --retry-failed re-runs only the failures."""
    from typer.testing import CliRunner

    from cts.cli import app

    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "golden"
    args = ["golden", "build", "--limit", "2", "--output-dir", str(out)]
    for item in (
        f"cache.path={tmp_path / 'responses.sqlite'}",
        f"search.tool_cache={tmp_path / 'tools.sqlite'}",
        "search.date=2026-11-30",
        "golden.max_nuggets=3",
    ):
        args += ["--set", item]
    first = CliRunner().invoke(app, args, catch_exceptions=False)
    summary = json.loads((out / "golden_summary.json").read_text())
    assert summary["instances"] == 2 and summary["seed"] == 1000  # provenance
    assert summary["built"] + len(summary["failed"]) == 2
    assert first.exit_code == (1 if summary["failed"] else 0), first.output
    assert "instances searched" in first.output
    for instance_id, why in summary["failed"].items():
        assert f"no nuggets for {instance_id}: {why.split(':')[0]}" in first.output
    rows = [json.loads(line) for line in (out / "dataset.jsonl").read_text().splitlines()]
    assert len(rows) == summary["built"]
    for row in rows:
        trace = json.loads((out / "traces" / row["golden"]["trace_id"]).read_text())
        shown = {e["id"] for s in trace["steps"] if s["kind"] == "tool" for e in s["evidence"]}
        nuggets = row["golden"]["nuggets"]
        assert row["golden"]["seed"] == 1000
        assert 1 <= len(nuggets) <= 3
        assert all(set(n["source_ids"]) <= shown and n["source_ids"] for n in nuggets)
        assert [n["id"] for n in nuggets] == [f"n{i}" for i in range(1, len(nuggets) + 1)]
    if rows:
        check = CliRunner().invoke(
            app, ["data", "validate", str(out / "dataset.jsonl"), "--corpus", "sample"]
        )
        assert check.exit_code == 0, check.output

    again = CliRunner().invoke(app, args, catch_exceptions=False)
    assert "0 instances searched, 2 already done" in again.output
    retry = CliRunner().invoke(app, [*args, "--retry-failed"], catch_exceptions=False)
    assert f"{len(summary['failed'])} instances searched" in retry.output


def test_golden_merge_refuses_a_dataset_changed_since_the_build(tmp_path):
    """`cts golden merge` (finish_golden) pairs each record's nuggets with the dataset's
    instance of its id: a fused query edited since the build would get nuggets of the old one.
    Refused as a resumed build is, naming fingerprint.dataset; a --limit is no change."""
    from cts.eval.experiment import build_golden, finish_golden
    from cts.eval.run.config import load_experiment
    from cts.foundation.yaml_config import ConfigError
    from tests.builders import scripted_experiment

    data = tmp_path / "ds.jsonl"
    rows = [
        {"id": "f1", "blurred_query": "Battery life?", "fused_query": "Korvex Aura Pro battery?"},
        {"id": "f2", "blurred_query": "Pass price?", "fused_query": "Vendrick monthly pass?"},
    ]

    def write(first: dict, second: dict) -> None:
        data.write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")

    write(*rows)
    config = scripted_experiment(
        tmp_path / "golden.yaml",
        "golden-fp",
        ["searcher", "summarizer", "nugget_builder"],
        {},
        {},
        dataset={"path": str(data), "split": None, "limit": 1},
        search={"backend": "local", "corpus": "sample", "tool_cache": str(tmp_path / "t.sqlite")},
        cache={"path": str(tmp_path / "responses.sqlite")},
    )
    run_dir = tmp_path / "golden"
    built = build_golden(load_experiment(str(config)), run_dir, show_progress=False)
    assert not built.outcome.interrupted
    # The fingerprint is of the whole dataset, the limit aside: the limited build merges.
    merged, report = finish_golden(run_dir)
    assert merged.ok and report is not None and report.built == 1
    written = (run_dir / "dataset.jsonl").read_text()
    assert json.loads(written)["fused_query"] == "Korvex Aura Pro battery?"
    # The built instance's query edited, or one past the limit: not the dataset it was built on.
    for edited in (
        ({**rows[0], "fused_query": "Zephyr X2 headphones battery?"}, rows[1]),
        (rows[0], {**rows[1], "fused_query": "Vendrick annual pass?"}),
    ):
        write(*edited)
        with pytest.raises(ConfigError) as refused:
            finish_golden(run_dir)
        message = str(refused.value)
        assert message.startswith(f"{run_dir / 'config.yaml'}: this run directory holds records")
        assert "fingerprint.dataset: " in message
        assert (run_dir / "dataset.jsonl").read_text() == written  # nothing rewritten
