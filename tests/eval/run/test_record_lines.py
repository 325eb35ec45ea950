"""What a records file may hold beyond the schema's types: a failed record names its kind and
stage, a nugget's label entry its label (else the reader stops naming file, line and field,
where the report once died on a bare KeyError); and `merge` checks for duplicates only among
the keys the run's config names."""

from __future__ import annotations

from pathlib import Path

import pytest

from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Record
from cts.eval.run.dialogue import failure
from cts.eval.run.records import RecordFileError, RecordStore, merge
from cts.eval.run.run_dir import Shard
from cts.serving.errors import EngineUnavailable

GOOD = '{"instance_id": "a", "condition": "blurred", "seed": 0}\n'


def _store_with(tmp_path: Path, line: str) -> RecordStore:
    store = RecordStore(tmp_path)
    path = store.path("blurred", Shard())
    path.parent.mkdir(parents=True)
    path.write_text(GOOD + line)
    return store


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ('"error": {"kind": "internal", "message": "m"}', "error.stage: missing"),
        ('"error": {"stage": "judge", "message": "m"}', "error.kind: missing"),
        ('"labels": {"n1": {"evidence": "x"}}', "labels.n1.label: missing"),
    ],
)
def test_an_incomplete_error_or_label_names_file_line_and_field(tmp_path, fields, problem):
    line = '{"instance_id": "b", "condition": "blurred", "seed": 0, ' + fields + "}\n"
    store = _store_with(tmp_path, line)
    with pytest.raises(RecordFileError, match=rf"shard-0-of-1.jsonl:2: {problem}"):
        store.completed()


def test_the_toolkits_own_failed_and_judged_records_read_back(tmp_path):
    store = RecordStore(tmp_path)
    internal = {"kind": "internal", "stage": "search", "message": "m", "traceback": "t"}
    written = [
        Record(instance_id="a", condition="blurred", seed=0, error=internal),
        Record(
            instance_id="b",
            condition="blurred",
            seed=0,
            error=failure(EngineUnavailable("down"), "rewrite"),
        ),
        Record(
            instance_id="c",
            condition="blurred",
            seed=0,
            labels={"n1": {"label": "full", "evidence": "x", "position": "2"}},
            scores={"restore_score_100": 100.0},
        ),
    ]
    for record in written:
        store.append(record, Shard())
    assert list(store.completed().values()) == written


def _scored(instance: str, seed: int, score: float) -> Record:
    return Record(
        instance_id=instance,
        condition="blurred",
        seed=seed,
        scores={"restore_score_100": score},
    )


def test_merge_finds_duplicates_only_among_the_keys_the_config_names(tmp_path):
    """A run narrowed to seed 0 keeps a seed-1 key recorded twice (under two shard layouts):
    nothing reads it, so it is no duplicate; one of seed 0 still is."""
    instances = load_instances(DatasetSource(path="sample", split="dev", limit=2))
    first, second = (i.id for i in instances)
    store = RecordStore(tmp_path)
    for instance in (first, second):
        store.append(_scored(instance, 0, 10.0), Shard())
    store.append(_scored(first, 1, 10.0), Shard())
    store.append(_scored(first, 1, 12.0), Shard(0, 2))
    narrowed = merge(store, instances, ["blurred"], [0])
    assert narrowed.ok and narrowed.duplicates == [] and narrowed.missing == []
    assert sorted(narrowed.records) == [(first, "blurred", 0), (second, "blurred", 0)]
    wide = merge(store, instances, ["blurred"], [0, 1])
    assert wide.duplicates == [(first, "blurred", 1)]
    assert wide.missing == [(second, "blurred", 1)]
