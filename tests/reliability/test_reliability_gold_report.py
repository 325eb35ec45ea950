"""Issue 13 §1.7 and §1.8: a gold join that matches nothing is a problem (and a run with no
golden nuggets at all is refused before any model call); `cts report` warns about incomplete
or duplicated runs, and refuses them with --strict, without touching the run directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.data.dataset import DatasetSource, GoldTable, check_source
from cts.eval.data.readers import DatasetError
from cts.eval.data.schema import Record
from cts.eval.run.config import load_experiment
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import Shard


def _query(key: str) -> str:
    return json.dumps({"id": key, "blurred_query": "q", "fused_query": f"q {key}"}) + "\n"


def _gold(key: object) -> str:
    return json.dumps({"id": key, "text": "a fact", "weight": 1}) + "\n"


# -- §1.7: the gold join ----------------------------------------------------------------------


def test_gold_ids_that_match_no_query_and_queries_without_gold_are_problems(tmp_path):
    queries = tmp_path / "q.jsonl"
    queries.write_text(_query("001") + _query("002"))
    gold = tmp_path / "gold.jsonl"
    gold.write_text(_gold(1) + _gold(2))
    checked = check_source(
        DatasetSource(path=str(queries), split=None, gold=GoldTable(path=str(gold)))
    )
    problems = [str(p) for p in checked.problems]
    assert any(p.startswith(f"{gold}:1: id:") and "'1'" in p for p in problems), problems
    assert any(p.startswith(f"{gold}:2: id:") and "'2'" in p for p in problems), problems
    assert any(p.startswith(f"{queries}:1: ") and str(gold) in p for p in problems), problems
    assert any(p.startswith(f"{queries}:2: ") and str(gold) in p for p in problems), problems
    runner = CliRunner()
    done = runner.invoke(app, ["data", "validate", str(queries), "--gold", str(gold)])
    assert done.exit_code == 1 and "OK" not in done.output, done.output
    # Matching ids join cleanly (and the join still reads a number id as its string).
    gold.write_text(_gold("001") + _gold("002"))
    fine = check_source(
        DatasetSource(path=str(queries), split=None, gold=GoldTable(path=str(gold)))
    )
    assert not fine.problems and all(i.golden for i in fine.instances)


def test_a_run_where_no_instance_has_golden_nuggets_is_refused_before_any_model_call(
    tmp_path, monkeypatch
):
    import cts.eval.experiment
    from cts.eval.experiment import run_experiment

    dataset = tmp_path / "queries.jsonl"
    dataset.write_text(_query("a") + _query("b"))

    def no_engines(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("a model was about to be called")

    monkeypatch.setattr(cts.eval.experiment, "open_engines", no_engines)
    resolved = load_experiment(
        None, [f"dataset.path={dataset}", "dataset.split=null", 'conditions=["blurred"]']
    )
    with pytest.raises(DatasetError, match="nothing could be scored") as refused:
        run_experiment(resolved, tmp_path / "run", show_progress=False)
    assert str(dataset) in str(refused.value)
    assert not (tmp_path / "run").exists()  # refused before anything was written


# -- §1.8: `cts report` of an incomplete or duplicated run ------------------------------------


def _incomplete_run(run_dir: Path) -> None:
    """Config: 3 sample instances × blurred × seed 0; records: the first twice (two shards),
    the second once, the third never."""
    resolved = load_experiment(None, ['conditions=["blurred"]', "seeds=[0]", "dataset.limit=3"])
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(resolved.to_yaml())
    from cts.eval.data.dataset import load_instances

    ids = [i.id for i in load_instances(resolved.experiment.dataset)]
    store = RecordStore(run_dir)
    scores = {"restore_score_100": 50.0, "strict": 25.0, "unweighted": 50.0}
    for shard in (Shard(0, 2), Shard(1, 2)):
        store.append(Record(instance_id=ids[0], condition="blurred", seed=0, scores=scores), shard)
    store.append(Record(instance_id=ids[1], condition="blurred", seed=0, scores=scores), Shard())


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_cts_report_warns_about_missing_and_duplicated_keys_and_strict_refuses(tmp_path):
    run_dir = tmp_path / "run"
    _incomplete_run(run_dir)
    before = _snapshot(run_dir)
    runner = CliRunner()
    out = tmp_path / "report"
    done = runner.invoke(app, ["report", str(run_dir), "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert "1 missing" in done.stderr and "1 duplicated" in done.stderr, done.stderr
    assert str(run_dir) in done.stderr
    assert (out / "summary.json").is_file()
    assert _snapshot(run_dir) == before  # read-only: the run directory is untouched
    strict_out = tmp_path / "strict"
    refused = runner.invoke(app, ["report", str(run_dir), "--out", str(strict_out), "--strict"])
    assert refused.exit_code == 1, refused.output
    assert "1 missing" in refused.stderr and "1 duplicated" in refused.stderr
    assert not strict_out.exists()  # nothing written
    assert _snapshot(run_dir) == before
