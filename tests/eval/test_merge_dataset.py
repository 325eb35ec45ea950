"""`cts merge` (cts.eval.experiment.merge_run) stands on the dataset the run ran on: a dataset
edited between the shards and the merge is refused, as a resume of the run would be, and nothing is
written; the dataset as it was merges."""

from __future__ import annotations

import json

import pytest

import cts.eval.experiment
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.experiment import merge_run, run_experiment
from cts.eval.run.config import load_experiment
from cts.eval.run.run_dir import Shard
from cts.foundation.yaml_config import ConfigError
from tests.scripted_cts import scripted_engines


def test_merge_refuses_a_dataset_edited_since_the_shards_ran(tmp_path, monkeypatch):
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(cts.eval.experiment, "open_engines", scripted_engines)
    dataset = tmp_path / "dev.jsonl"
    rows = [i.model_dump(exclude_none=True) for i in load_instances(DatasetSource(path="sample"))]
    dataset.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows[:3]))
    resolved = load_experiment(
        "quickstart",
        [
            f"dataset.path={dataset}",
            "dataset.split=null",
            "dataset.limit=2",  # the instance past the limit is fingerprinted too
            "conditions=[blurred]",
            f"cache.path={tmp_path / 'responses.sqlite'}",
            f"search.tool_cache={tmp_path / 'tools.sqlite'}",
        ],
    )
    run = tmp_path / "run"
    for i in range(2):
        ran = run_experiment(resolved, run, shard=Shard(i, 2), show_progress=False)
        assert ran.outcome.ran == 1 and not ran.outcome.failures
    as_ran = dataset.read_text()
    for edited in ({**rows[0], "fused_query": "Another query?"}, {**rows[2], "language": "zh"}):
        changed = [edited if r["id"] == edited["id"] else r for r in rows[:3]]
        dataset.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in changed))
        with pytest.raises(ConfigError, match=r"fingerprint\.dataset"):
            merge_run(run)
        assert not (run / "summary.json").exists()
        assert not (run / "records" / "blurred" / "merged.jsonl").exists()
    dataset.write_text(as_ran)
    assert merge_run(run).ok
    assert (run / "summary.json").is_file()
