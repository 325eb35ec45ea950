"""nuggetizer interoperability: `cts golden import|export --from|--to nuggetizer` and `cts judge
export --to nuggetizer`. The fixtures are hand-written in the shapes nuggetizer's README
documents (`create` output: {query, qid, nuggets: [{text, importance}]}; `assign --input-kind
answers` output: {query, qid, answer_text, response_length, run_id, nuggets: [{text,
importance, assignment}]}); round trips keep texts, weights (through the weight map) and
labels; the weight map both ways; unknown qids and bad rows named at file:line; exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.audit.citations import load_audit_dataset
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Instance, Record
from cts.eval.interop.nuggetizer import (
    NuggetizerError,
    labels_by_id,
    parse_weight_map,
    read_assignments,
    read_nuggets,
)
from cts.eval.interop.nuggetizer_transfer import (
    assignment_rows,
    export_assignments,
    import_nuggets,
    nugget_rows,
    response_length,
    write_jsonl,
)
from cts.eval.run.config import load_experiment
from cts.eval.run.fingerprint import fingerprint
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import RunDir, Shard

runner = CliRunner()
DEFAULT = parse_weight_map()


def write_lines(path: Path, rows: list[Any]) -> Path:
    path.write_text(
        "".join(
            (r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows
        ),
        encoding="utf-8",
    )
    return path


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# nuggetizer's `create` output, as its README's example shows it (the trace and reasoning keys
# it adds on request are ignored when reading).
CREATED = [
    {
        "query": "What is Python?",
        "qid": "q1",
        "nuggets": [
            {"text": "Python is a high-level programming language", "importance": "vital"},
            {"text": "Python was created by Guido van Rossum", "importance": "vital"},
            {"text": "Python is used for web development", "importance": "okay"},
            {"text": "Python is used for data science", "importance": "okay"},
        ],
        "trace": {"prompt": "...", "response": "...", "input_token_count": 245},
    },
    {
        "query": "伦敦的人口是多少?",
        "qid": "q2",
        "nuggets": [
            {"text": "伦敦人口约为九百万。", "importance": "vital", "reasoning": "core fact"},
            {"text": "伦敦是英国的首都。", "importance": "okay"},
        ],
    },
]


def instance(key: str, fused: str, nuggets: list[tuple[str, str, float, list[str]]] | None) -> dict:
    row: dict[str, Any] = {
        "id": key,
        "blurred_query": f"blurred {key}",
        "fused_query": fused,
        "language": "zh" if key == "q2" else "en",
    }
    if nuggets is not None:
        row["golden"] = {
            "nuggets": [
                {"id": i, "text": t, "weight": w, "source_ids": s} for i, t, w, s in nuggets
            ],
            "trace_id": f"golden/{key}",
        }
    return row


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """q1 has two golden nuggets (one of them also in CREATED, weighted 2), q2 none yet, q3
    nuggets nuggetizer never saw."""
    return write_lines(
        tmp_path / "dataset.jsonl",
        [
            instance(
                "q1",
                "What is Python?",
                [
                    ("n1", "Python was created by  Guido van Rossum", 2, ["d1"]),
                    ("n2", "Python 3.0 was released in 2008", 1, ["d2"]),
                ],
            ),
            instance("q2", "伦敦的人口是多少?", None),
            instance("q3", "Who wrote Hamlet?", [("n1", "Shakespeare wrote Hamlet", 3, ["d3"])]),
        ],
    )


def load(path: Path) -> dict[str, Instance]:
    return {i.id: i for i in load_instances(DatasetSource(path=str(path), split=None))}


def nuggets_of(found: Instance) -> list[tuple[str, str, float, list[str]]]:
    assert found.golden is not None
    return [(n.id, n.text, n.weight, n.source_ids) for n in found.golden.nuggets]


# -- the weight map -------------------------------------------------------------------------------


def test_the_weight_map_both_ways():
    assert DEFAULT.weights == {"vital": 3.0, "okay": 1.0} and DEFAULT.vital_from == 3.0
    # Exporting: at or above vital_from is vital; our 2 ("important") is not, by default.
    assert [DEFAULT.importance(w) for w in (3, 2.5, 2, 1)] == ["vital", "okay", "okay", "okay"]
    lower = parse_weight_map("vital=3,okay=1", vital_from=2)
    assert [lower.importance(w) for w in (3, 2, 1.5, 1)] == ["vital", "vital", "okay", "okay"]
    custom = parse_weight_map(" vital = 2 , okay=0.5,failed=0.5")
    assert custom.weights == {"vital": 2.0, "okay": 0.5, "failed": 0.5}
    assert custom.importance(2) == "vital" and custom.importance(0.5) == "okay"
    # Every weight the map gives exports as the word it came from.
    for weights in (DEFAULT, lower, custom):
        for word in ("vital", "okay"):
            assert weights.importance(weights.weights[word]) == word


@pytest.mark.parametrize(
    ("text", "vital_from", "field", "message"),
    [
        ("vital=3", None, "okay", "missing"),
        ("okay=1", None, "vital", "missing"),
        ("vital=1,okay=1", None, "vital", "must weigh more than okay"),
        ("vital=high,okay=1", None, "vital", "must be a number > 0, got 'high'"),
        ("vital=3,okay=0", None, "okay", "must be a number > 0"),
        ("vital=3,okay=nan", None, "okay", "must be a number > 0"),
        ("vital=3,vital=2,okay=1", None, "vital", "given twice"),
        ("vital:3,okay=1", None, "vital:3", "expected WORD=WEIGHT"),
        ("vital=3,,okay=1", None, "(empty)", "expected WORD=WEIGHT"),
        ("vital=3,okay=1", 1.0, "weight", "above okay's weight (1) and at most vital's (3)"),
        ("vital=3,okay=1", 4.0, "weight", "got 4.0"),
    ],
)
def test_a_bad_weight_map_is_named(text, vital_from, field, message):
    with pytest.raises(NuggetizerError) as caught:
        parse_weight_map(text, vital_from)
    (problem,) = caught.value.problems
    assert problem.file in ("--weight-map", "--vital-from")
    assert problem.field == field and message in problem.message


# -- reading nuggetizer's files ---------------------------------------------------------------


def test_reads_the_create_output_as_documented(tmp_path):
    read = read_nuggets(write_lines(tmp_path / "nuggets.jsonl", CREATED))
    assert [(q.qid, q.query, q.line) for q in read] == [
        ("q1", "What is Python?", 1),
        ("q2", "伦敦的人口是多少?", 2),
    ]
    assert read[0].nuggets[1] == ("Python was created by Guido van Rossum", "vital")
    assert [imp for _, imp in read[0].nuggets] == ["vital", "vital", "okay", "okay"]
    assert read[1].nuggets == [("伦敦人口约为九百万。", "vital"), ("伦敦是英国的首都。", "okay")]


def test_a_nugget_without_importance_is_vital_as_nuggetizer_reads_it(tmp_path):
    path = write_lines(tmp_path / "n.jsonl", [{"qid": 7, "nuggets": [{"text": "a fact"}]}])
    (read,) = read_nuggets(path)
    assert (read.qid, read.query, read.nuggets, read.defaulted) == (
        "7",
        None,
        [("a fact", "vital")],
        1,
    )


def test_bad_rows_are_each_named_at_file_and_line(tmp_path):
    path = write_lines(
        tmp_path / "bad.jsonl",
        [
            CREATED[0],
            '{"qid": "q2", "nuggets": [',  # 2: not JSON
            {"nuggets": [{"text": "x", "importance": "vital"}]},  # 3: no qid
            {"qid": "q3", "nuggets": "a fact"},  # 4: not a list
            {"qid": "q4", "nuggets": [{"importance": "vital"}, "a fact"]},  # 5
            {"qid": "q5", "nuggets": [{"text": "x", "importance": 3}]},  # 6
            {"qid": "q1", "nuggets": [{"text": "y", "importance": "okay"}]},  # 7: qid again
            {"qid": "q6", "nuggets": [{"text": "Same  text"}, {"text": "Same text"}]},  # 8
            {"qid": "q7", "nuggets": []},  # 9
            [1, 2],  # 10
        ],
    )
    with pytest.raises(NuggetizerError) as caught:
        read_nuggets(path)
    found = {(p.line, p.field): p.message for p in caught.value.problems}
    assert found.pop((2, "<row>")).startswith("malformed JSON")
    assert found.pop((3, "qid")) == "missing"
    assert found.pop((4, "nuggets")) == "must be a list"
    assert found.pop((5, "nuggets[0].text")) == "missing"
    assert found.pop((5, "nuggets[1]")) == "expected a JSON object"
    assert found.pop((6, "nuggets[0].importance")) == "must be a string, got 3"
    assert found.pop((7, "qid")) == "qid 'q1' given twice (first at line 1)"
    assert found.pop((8, "nuggets[1].text")) == "the same text as nuggets[0]"
    assert found.pop((9, "nuggets")) == "empty"
    assert "expected a JSON object" in found.pop((10, "<row>"))
    assert found == {}
    assert str(caught.value.problems[0]).startswith(f"{path}:2: <row>: malformed JSON")


def test_only_jsonl_is_read(tmp_path):
    path = tmp_path / "nuggets.txt"
    path.write_text(json.dumps(CREATED[0]) + "\n")
    with pytest.raises(NuggetizerError, match=r"expected a \.jsonl file"):
        read_nuggets(path)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(NuggetizerError, match="no nuggets"):
        read_nuggets(empty)


# -- import: merged into a dataset by qid -------------------------------------------------------


def test_import_merges_by_qid_keeping_ids_and_sources_of_known_texts(tmp_path, dataset):
    out = tmp_path / "merged.jsonl"
    report = import_nuggets(write_lines(tmp_path / "n.jsonl", CREATED), str(dataset), out, DEFAULT)
    merged = load(out)
    # q1: n1's text is in the file (spacing aside): its id, text and source stay, its weight
    # is the file's (vital → 3). n2 is kept (merge, not replace). New texts get n3.., no sources.
    assert nuggets_of(merged["q1"]) == [
        ("n1", "Python was created by  Guido van Rossum", 3.0, ["d1"]),
        ("n2", "Python 3.0 was released in 2008", 1.0, ["d2"]),
        ("n3", "Python is a high-level programming language", 3.0, []),
        ("n4", "Python is used for web development", 1.0, []),
        ("n5", "Python is used for data science", 1.0, []),
    ]
    assert merged["q1"].golden is not None and merged["q1"].golden.trace_id == "golden/q1"
    assert nuggets_of(merged["q2"]) == [
        ("n1", "伦敦人口约为九百万。", 3.0, []),
        ("n2", "伦敦是英国的首都。", 1.0, []),
    ]
    assert merged["q3"] == load(dataset)["q3"]  # not in the file: unchanged
    assert (report.instances, report.updated) == (3, ["q1", "q2"])
    assert (report.added, report.matched, report.reweighted, report.dropped) == (5, 1, 1, 0)
    # Nothing nuggetizer wrote cites evidence: `cts golden audit` will flag these.
    assert report.without_sources == 5 and report.other_query == []


def test_import_with_replace_drops_the_nuggets_the_file_lacks(tmp_path, dataset):
    out = tmp_path / "merged.jsonl"
    nuggets = write_lines(tmp_path / "n.jsonl", CREATED[:1])
    report = import_nuggets(nuggets, str(dataset), out, DEFAULT, replace=True)
    assert [n[0] for n in nuggets_of(load(out)["q1"])] == ["n1", "n3", "n4", "n5"]
    assert report.dropped == 1 and load(out)["q2"].golden is None


def test_a_custom_map_weighs_other_words(tmp_path, dataset):
    created = {
        "qid": "q2",
        "query": "other text",
        "nuggets": [{"text": "x", "importance": "failed"}],
    }
    nuggets = write_lines(tmp_path / "n.jsonl", [created])
    with pytest.raises(NuggetizerError) as caught:
        import_nuggets(nuggets, str(dataset), tmp_path / "out.jsonl", DEFAULT)
    (problem,) = caught.value.problems
    assert (problem.line, problem.field) == (1, "nuggets[0].importance")
    assert "'failed' is not in the weight map" in problem.message
    custom = parse_weight_map("vital=2,okay=1,failed=0.5")
    report = import_nuggets(nuggets, str(dataset), tmp_path / "out.jsonl", custom)
    assert nuggets_of(load(tmp_path / "out.jsonl")["q2"]) == [("n1", "x", 0.5, [])]
    assert report.other_query == ["q2"]  # neither the fused nor the blurred query


def test_one_text_in_two_nuggets_reweights_both_keeping_each_id_and_sources(tmp_path):
    # n1 and n2 state one fact (other weights, other sources); the file names it once, okay.
    # Both take weight 1 and keep their own ids and citations; n3 is untouched (no --replace).
    same, other = "The earbuds play for 7.5 hours.", "The case gives 30 hours in total."
    stated = [
        ("n1", same, 3, ["A-0001"]),
        ("n2", same, 2, ["A-0002"]),
        ("n3", other, 1, ["A-0001"]),
    ]
    query = "What is the battery life of the Korvex Aura Pro earbuds?"
    dataset = write_lines(tmp_path / "d.jsonl", [instance("q1", query, stated)])
    given = {
        "qid": "q1",
        "nuggets": [{"text": "The earbuds play for  7.5 hours.", "importance": "okay"}],
    }
    nuggets = write_lines(tmp_path / "n.jsonl", [given])
    out = tmp_path / "out.jsonl"
    report = import_nuggets(nuggets, str(dataset), out, DEFAULT)
    assert nuggets_of(load(out)["q1"]) == [
        ("n1", same, 1.0, ["A-0001"]),
        ("n2", same, 1.0, ["A-0002"]),
        ("n3", other, 1.0, ["A-0001"]),
    ]
    assert (report.added, report.matched, report.reweighted, report.dropped) == (0, 2, 2, 0)
    # --replace keeps both (the file has their text) and drops only n3.
    report = import_nuggets(nuggets, str(dataset), out, DEFAULT, replace=True)
    assert [n[:3] for n in nuggets_of(load(out)["q1"])] == [("n1", same, 1.0), ("n2", same, 1.0)]
    assert (report.matched, report.dropped) == (2, 1)


def test_sample_is_every_split_to_import_as_to_export_and_audit(tmp_path):
    # `golden export sample` writes all 72 instances (dev, test, train): importing one of them
    # back writes all 72, the other 71 unchanged, the train split included.
    exported = tmp_path / "sample.nuggets.jsonl"
    written = write_jsonl(nugget_rows(load_audit_dataset("sample").instances, DEFAULT), exported)
    assert written == 72
    one = write_lines(
        tmp_path / "one.jsonl", [r for r in lines(exported) if r["qid"] == "A-train-01"]
    )
    out = tmp_path / "out.jsonl"
    report = import_nuggets(one, "sample", out, DEFAULT)
    assert (report.instances, report.updated) == (72, ["A-train-01"])
    ids = [r["id"] for r in lines(out)]
    assert len(ids) == 72 and sum("-train-" in i for i in ids) == 24
    # The whole file round-trips: no qid is unknown.
    report = import_nuggets(exported, "sample", out, DEFAULT)
    assert len(report.updated) == 72
    # --split still narrows `sample` to one split.
    report = import_nuggets(one, "sample", out, DEFAULT, split="train")
    assert (report.instances, len(lines(out))) == (24, 24)


def test_an_unknown_qid_is_refused_at_its_line_and_nothing_is_written(tmp_path, dataset):
    rows = [CREATED[0], {**CREATED[1], "qid": "q9"}, {**CREATED[1], "qid": "q10"}]
    nuggets = write_lines(tmp_path / "n.jsonl", rows)
    out = tmp_path / "out.jsonl"
    with pytest.raises(NuggetizerError) as caught:
        import_nuggets(nuggets, str(dataset), out, DEFAULT)
    assert [str(p) for p in caught.value.problems] == [
        f"{nuggets}:2: qid: unknown qid 'q9': no instance with this id in {dataset}",
        f"{nuggets}:3: qid: unknown qid 'q10': no instance with this id in {dataset}",
    ]
    assert not out.exists()


# -- round trips ----------------------------------------------------------------------------------


def test_round_trip_dataset_to_nuggetizer_and_back_keeps_texts_and_weights(tmp_path):
    # Weights the map gives (3 and 1) come back exactly, ids and sources too (matched by text).
    dataset = write_lines(
        tmp_path / "d.jsonl",
        [
            instance("q1", "fused one", [("a", "fact one", 3, ["d1"]), ("b", "fact two", 1, [])]),
            instance("q2", "伦敦的人口是多少?", [("n1", "伦敦人口约为九百万。", 3, ["d9"])]),
        ],
    )
    before = load(dataset)
    exported = tmp_path / "nuggets.jsonl"
    write_jsonl(nugget_rows(before.values(), DEFAULT), exported)
    assert lines(exported)[0] == {
        "query": "fused one",
        "qid": "q1",
        "nuggets": [
            {"text": "fact one", "importance": "vital"},
            {"text": "fact two", "importance": "okay"},
        ],
    }
    out = tmp_path / "back.jsonl"
    import_nuggets(exported, str(dataset), out, DEFAULT, replace=True)
    assert load(out) == before
    # A weight the map cannot give (2) comes back as the word's weight: the documented loss.
    two = write_lines(tmp_path / "two.jsonl", [instance("q1", "f", [("a", "fact", 2, [])])])
    write_jsonl(nugget_rows(load(two).values(), DEFAULT), exported)
    import_nuggets(exported, str(two), out, DEFAULT, replace=True)
    assert nuggets_of(load(out)["q1"]) == [("a", "fact", 1.0, [])]
    # ... unless --vital-from makes it vital, and a map weighs vital 2.
    two_map = parse_weight_map("vital=2,okay=1")
    write_jsonl(nugget_rows(load(two).values(), two_map), exported)
    import_nuggets(exported, str(two), out, two_map, replace=True)
    assert nuggets_of(load(out)["q1"]) == [("a", "fact", 2.0, [])]


def test_round_trip_nuggetizer_to_dataset_and_back_keeps_texts_and_importance(tmp_path):
    dataset = write_lines(
        tmp_path / "d.jsonl",
        [instance("q1", "What is Python?", None), instance("q2", "伦敦的人口是多少?", None)],
    )
    given = write_lines(tmp_path / "given.jsonl", CREATED)
    out = tmp_path / "with-gold.jsonl"
    import_nuggets(given, str(dataset), out, DEFAULT)
    again = tmp_path / "again.jsonl"
    write_jsonl(nugget_rows(load(out).values(), DEFAULT), again)
    expected = [{k: v for k, v in row.items() if k != "trace"} for row in CREATED]
    for row in expected:
        row["nuggets"] = [
            {"text": n["text"], "importance": n["importance"]} for n in row["nuggets"]
        ]
    assert lines(again) == expected


# -- judge labels as assignments ------------------------------------------------------------------

LABELS = {"n1": "full", "n2": "partial", "n3": "none"}


def judged(key: str, condition: str, labels: dict[str, str], seed: int = 0, **extra: Any) -> Record:
    return Record(
        instance_id=key,
        condition=condition,
        seed=seed,
        answer=f"answer to {key} under {condition}",
        labels={n: {"label": label, "evidence": "quote"} for n, label in labels.items()},
        scores={"restore_score_100": 50.0} if labels else {},
        **extra,
    )


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run directory of a 2-instance dataset (q1 in English with 3 nuggets, q2 in Chinese
    with 1) with judged, failed and unjudged records."""
    dataset = write_lines(
        tmp_path / "run-dataset.jsonl",
        [
            instance(
                "q1",
                "What is Python?",
                [
                    ("n1", "fact one", 3, ["d1"]),
                    ("n2", "fact two", 2, []),
                    ("n3", "fact three", 1, []),
                ],
            ),
            instance("q2", "伦敦的人口是多少?", [("n1", "伦敦人口约为九百万。", 3, [])]),
        ],
    )
    resolved = load_experiment(
        None,
        [
            f"dataset.path={dataset}",
            "dataset.split=null",
            "dataset.limit=null",
            "conditions=[blurred,oracle]",
            "seeds=[0,1]",
        ],
    )
    run_dir = RunDir(tmp_path / "my-run")
    run_dir.write_config(resolved, fingerprint(load_instances(resolved.experiment.dataset)))
    store = RecordStore(run_dir.root)
    for record in [
        judged("q1", "oracle", LABELS),
        judged("q1", "blurred", {"n1": "none", "n2": "none", "n3": "partial"}),
        judged("q2", "blurred", {"n1": "full"}, language="zh"),
        judged("q2", "oracle", {}, error={"kind": "timeout", "stage": "search", "message": "x"}),
        judged("q1", "blurred", {}, seed=1, error={"kind": "bad", "stage": "judge", "message": ""}),
        judged("q2", "blurred", {"n7": "full"}, seed=1),  # labels other nuggets
    ]:
        store.append(record, Shard())
    return run_dir.root


def test_judge_export_writes_the_assign_output_shape(tmp_path, run):
    out = tmp_path / "assignments.jsonl"
    export = export_assignments(run, out, DEFAULT)
    rows = lines(out)
    # Ordered by condition (the study's order), then instance, then seed.
    assert [(r["qid"], r["run_id"]) for r in rows] == [
        ("q1", "my-run.blurred.seed0"),
        ("q2", "my-run.blurred.seed0"),
        ("q1", "my-run.oracle.seed0"),
    ]
    assert rows[2] == {
        "query": "What is Python?",
        "qid": "q1",
        "answer_text": "answer to q1 under oracle",
        "response_length": 5,
        "run_id": "my-run.oracle.seed0",
        "nuggets": [
            {"text": "fact one", "importance": "vital", "assignment": "support"},
            {"text": "fact two", "importance": "okay", "assignment": "partial_support"},
            {"text": "fact three", "importance": "okay", "assignment": "not_support"},
        ],
    }
    assert export.written == 3 and export.run_ids == ["my-run.blurred.seed0", "my-run.oracle.seed0"]
    assert dict(export.skipped) == {
        "failed at search": 1,
        "failed at judge": 1,
        "labels name other nuggets than the dataset's": 1,
    }


def test_round_trip_judge_labels_through_assignments(tmp_path, run):
    out = tmp_path / "assignments.jsonl"
    export_assignments(run, out, DEFAULT)
    instances = {
        i.id: i
        for i in load_instances(DatasetSource(path=str(tmp_path / "run-dataset.jsonl"), split=None))
    }
    records = RecordStore(run).completed()
    for answer in read_assignments(out):
        _, condition, seed = answer.run_id.split(".")
        record = records[(answer.qid, condition, int(seed.removeprefix("seed")))]
        assert answer.answer_text == record.answer
        assert labels_by_id(answer, instances[answer.qid]) == {
            n: v["label"] for n, v in record.labels.items()
        }


def test_judge_export_of_one_condition_and_a_changed_dataset(tmp_path, run):
    out = tmp_path / "oracle.jsonl"
    export = export_assignments(run, out, DEFAULT, conditions=["oracle"], run_name="sys")
    assert [r["run_id"] for r in lines(out)] == ["sys.oracle.seed0"] and export.written == 1
    with pytest.raises(NuggetizerError, match="no records of 'clarify@1'"):
        export_assignments(run, out, DEFAULT, conditions=["clarify@1"])
    # The dataset edited since the run: labels would be paired with other nuggets.
    dataset = tmp_path / "run-dataset.jsonl"
    dataset.write_text(dataset.read_text().replace("fact two", "fact 2"))
    with pytest.raises(NuggetizerError, match=r"not the dataset .* ran on"):
        export_assignments(run, out, DEFAULT)


def test_reads_the_assign_output_as_documented(tmp_path):
    assigned = {
        "query": "What is Python?",
        "qid": "q1",
        "answer_text": "Python is a high-level programming language...",
        "response_length": 42,
        "run_id": "run-123",
        "nuggets": [
            {
                "text": "Python is a high-level programming language",
                "importance": "vital",
                "assignment": "support",
            },
            {
                "text": "Python was created by Guido van Rossum",
                "importance": "vital",
                "assignment": "support",
            },
            {
                "text": "Python is used for data science",
                "importance": "okay",
                "assignment": "partial_support",
            },
            {
                "text": "Python supports multithreading",
                "importance": "okay",
                "assignment": "not_support",
            },
        ],
    }
    bad = {**assigned, "nuggets": [{"text": "x", "importance": "okay", "assignment": "supported"}]}
    path = write_lines(tmp_path / "a.jsonl", [assigned])
    (answer,) = read_assignments(path)
    assert (answer.qid, answer.run_id) == ("q1", "run-123")
    assert [label for _, _, label in answer.nuggets] == ["full", "full", "partial", "none"]
    with pytest.raises(NuggetizerError) as caught:
        read_assignments(write_lines(tmp_path / "bad.jsonl", [assigned, bad]))
    (problem,) = caught.value.problems
    assert (problem.line, problem.field) == (2, "nuggets[0].assignment")
    assert "'supported' is not one of support, partial_support, not_support" in problem.message
    # A text the instance has no nugget with cannot be given a label.
    python = Instance.model_validate(
        instance(
            "q1", "What is Python?", [("n1", "Python is a high-level programming language", 3, [])]
        )
    )
    with pytest.raises(NuggetizerError, match=r"a.jsonl:1: nuggets\[1\].text: no golden nugget"):
        labels_by_id(answer, python)


def test_response_length_counts_words_or_characters():
    assert response_length("Python is  a language.", "en") == 4
    assert response_length("伦敦 人口约为九百万。", "zh") == 10
    assert response_length("", "en") == 0


def test_assignment_rows_never_invent_labels():
    fact = Instance.model_validate(instance("q1", "f", [("n1", "fact", 3, [])]))
    rows, export = assignment_rows([judged("q1", "oracle", {})], [fact], DEFAULT, "r")
    assert rows == [] and dict(export.skipped) == {"not judged (no labels)": 1}


# -- the commands and their exit codes -----------------------------------------------------------


def test_golden_import_and_export_commands(tmp_path, dataset):
    def golden_import(given: Path, out: Path) -> Result:
        args = ["--from", "nuggetizer", "--dataset", str(dataset), "--out", str(out)]
        return runner.invoke(app, ["golden", "import", str(given), *args])

    def golden_export(*more: str) -> Result:
        args = ["--to", "nuggetizer", "--out", str(exported), *more]
        return runner.invoke(app, ["golden", "export", str(out), *args])

    given = write_lines(tmp_path / "n.jsonl", CREATED)
    out = tmp_path / "merged.jsonl"
    done = golden_import(given, out)
    assert done.exit_code == 0, done.output
    assert "2 of 3 instances got nuggetizer nuggets: 5 added, 1 matched" in done.output
    assert "5 nugget(s) of the imported instances cite no evidence" in done.output
    exported = tmp_path / "back.jsonl"
    done = golden_export("--vital-from", "2")
    assert done.exit_code == 0, done.output
    assert "3 instance(s) with golden nuggets written" in done.output
    assert [r["qid"] for r in lines(exported)] == ["q1", "q2", "q3"]

    unknown = write_lines(tmp_path / "unknown.jsonl", [{**CREATED[0], "qid": "nope"}])
    refused = golden_import(unknown, tmp_path / "x.jsonl")
    assert refused.exit_code == 2
    assert f"{unknown}:1: qid: unknown qid 'nope'" in refused.output
    assert not (tmp_path / "x.jsonl").exists()
    bad_map = golden_export("--weight-map", "vital=3")
    assert bad_map.exit_code == 2 and "--weight-map: okay: missing" in bad_map.output
    other = runner.invoke(
        app, ["golden", "export", str(out), "--to", "ragas", "--out", str(exported)]
    )
    assert other.exit_code == 2


def test_judge_export_command(tmp_path, run):
    out = tmp_path / "a.jsonl"
    done = runner.invoke(
        app, ["judge", "export", str(run), "--to", "nuggetizer", "--out", str(out)]
    )
    assert done.exit_code == 0, done.output
    assert "3 judged answer(s) written as nuggetizer assignments" in done.output
    assert "left out: 1 record(s) failed at search" in done.output
    # A golden construction's folder, or any run whose records have no labels: exit 1.
    unjudged = tmp_path / "unjudged"
    RunDir(unjudged).config.parent.mkdir(parents=True)
    RunDir(unjudged).config.write_text((run / "config.yaml").read_text())
    nothing = runner.invoke(
        app,
        [
            "judge",
            "export",
            str(unjudged),
            "--to",
            "nuggetizer",
            "--out",
            str(tmp_path / "n.jsonl"),
        ],
    )
    assert nothing.exit_code == 1 and "nothing written" in nothing.output
    assert not (tmp_path / "n.jsonl").exists()
    not_a_run = runner.invoke(
        app, ["judge", "export", str(tmp_path), "--to", "nuggetizer", "--out", str(out)]
    )
    assert not_a_run.exit_code == 2 and "no config.yaml" in not_a_run.output
