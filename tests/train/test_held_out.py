"""Training queries are held out from evaluation queries by what they are, not where they are:
a copy of the evaluated dev split under another path (renamed ids, queries re-cased and
re-punctuated, golden construction's dataset.jsonl) is refused naming the overlapping ids; a
role adapter fitted on the queries the loop samples is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import cts.eval.experiment
from cts.cli import app
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.run.config import load_experiment
from cts.foundation.yaml_config import ConfigError
from cts.train.config import load_train_config
from cts.train.held_out import (
    TRAINED_ON,
    fitting_record,
    held_out_overlap,
    normalised,
    roles_fitted_on,
)
from cts.train.loop import MAIN, Iteration, evaluation
from cts.train.sample import sampling_experiment
from tests.scripted_cts import scripted_engines

DEV = Path("cts/eval/sample_data/dev.jsonl")


def train_yaml(tmp_path: Path, **extra: object) -> Path:
    doc = {"name": "t", "experiment": "quickstart", "candidates": 2, **extra}
    doc["output_dir"] = str(tmp_path / "out")
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def copy_of_dev(path: Path, edit=lambda row: row) -> Path:  # type: ignore[no-untyped-def]
    rows = [edit(json.loads(line)) for line in DEV.read_text().splitlines()]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def test_normalised_queries_ignore_case_width_spacing_and_punctuation():
    assert normalised("What is the  Korvex Aura's battery life?") == normalised(
        "what is the korvex auras battery life"
    )
    assert normalised("２０２４年，北京？") == normalised("2024年北京")
    assert normalised("C++ vs C#") != normalised("C vs D")


def test_a_copy_of_the_evaluated_split_under_another_path_is_refused_naming_the_ids(
    tmp_path, monkeypatch
):
    # The quickstart evaluates the sample's dev split; sampling reads the same queries from a
    # file of their own. The path check alone let this run (on scripted engines here).
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(cts.eval.experiment, "open_engines", scripted_engines)
    copy = copy_of_dev(tmp_path / "copy.jsonl")
    config = train_yaml(tmp_path, dataset=str(copy), limit=2)
    result = CliRunner().invoke(app, ["train", "sample", "-c", str(config)])
    assert result.exit_code == 2, result.output
    assert f"{config}:" in result.output and "dataset:" in result.output
    assert "2 of the instances sampling would read" in result.output
    assert "A-dev-01 (same id), A-dev-02 (same id)." in result.output
    assert not (tmp_path / "out").exists()


def test_renamed_ids_and_reformatted_queries_are_still_the_same_instances(tmp_path):
    def disguised(row: dict) -> dict:
        return {
            **row,
            "id": "X" + row["id"],
            "blurred_query": row["blurred_query"].upper() + " ",
            "fused_query": row["fused_query"].replace("?", " ?!"),
        }

    copy = copy_of_dev(tmp_path / "renamed.jsonl", disguised)
    with pytest.raises(ConfigError) as refused:
        sampling_experiment(load_train_config(train_yaml(tmp_path, dataset=str(copy))))
    message = str(refused.value)
    assert "24 of the instances sampling would read" in message
    assert "XA-dev-01 = A-dev-01 (same blurred query)" in message and "and 14 more" in message
    found = held_out_overlap(DatasetSource(path=str(copy)), DatasetSource(path="sample"))
    assert len(found) == 24 and {o.why for o in found} == {"same blurred query"}


def test_golden_constructions_dataset_of_the_evaluated_split_is_refused(tmp_path):
    """`cts golden build` writes the dataset with golden filled in: the same instances."""
    golden = tmp_path / "golden" / "dataset.jsonl"
    golden.parent.mkdir()
    copy_of_dev(golden)
    found = held_out_overlap(
        DatasetSource(path=str(golden), limit=3), DatasetSource(path="sample", split="dev")
    )
    assert [o.describe() for o in found] == [
        "A-dev-01 (same id)",
        "A-dev-02 (same id)",
        "A-dev-03 (same id)",
    ]


def test_held_out_splits_and_a_partly_overlapping_file_are_told_apart(tmp_path):
    assert held_out_overlap(DatasetSource(split="train"), DatasetSource(split="dev")) == []
    sampling_experiment(load_train_config(train_yaml(tmp_path, split="train")))  # accepted
    # Training rows plus one dev query under a new id: only that one is named.
    train = load_instances(DatasetSource(split="train"))
    dev = load_instances(DatasetSource(split="dev"))
    leaked = dev[5].model_copy(update={"id": "T-new"})
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(i.model_dump_json() + "\n" for i in [*train[:4], leaked, *train[4:8]]))
    with pytest.raises(ConfigError, match=r"1 of the instances .* T-new = A-dev-06 \(same"):
        sampling_experiment(load_train_config(train_yaml(tmp_path, dataset=str(mixed))))


def test_the_loops_evaluation_is_checked_by_instances_too(tmp_path):
    """The loop samples on the train split; an evaluation variant that reads a copy of it
    under another path is refused, one that reads a copy of dev is not."""
    train_copy = tmp_path / "train-copy.jsonl"
    train_copy.write_text(Path("cts/eval/sample_data/train.jsonl").read_text())
    for copy, refused in ((copy_of_dev(tmp_path / "dev-copy.jsonl"), False), (train_copy, True)):
        overrides = [f"dataset.path={copy}", "dataset.split=null"]
        config = load_train_config(
            train_yaml(tmp_path, split="train", loop={"evaluation_overrides": overrides})
        )
        iteration = Iteration(0, tmp_path / "out", None)
        if not refused:
            assert evaluation(config, iteration, MAIN).experiment.dataset.path == str(copy)
            continue
        with pytest.raises(ConfigError, match=r"loop's evaluation .* holds 24 of the instances"):
            evaluation(config, iteration, MAIN)


def _fitted_adapter(folder: Path, instances: list) -> Path:  # type: ignore[type-arg]
    """An adapter folder whose record says it was fitted on `instances`."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    record = {"steps": 1, TRAINED_ON: fitting_record(instances, "dev copy")}
    (folder / "answerer_train.json").write_text(json.dumps(record))
    return folder


def test_a_role_fitted_on_the_sampled_instances_is_named_whatever_their_ids(tmp_path):
    dev = load_instances(DatasetSource(path=str(DEV)))
    adapter = _fitted_adapter(tmp_path / "adapter", dev[:5])
    resolved = load_experiment("quickstart", [f"models.smollm2-135m-answerer.adapter={adapter}"])
    record = json.loads((adapter / "answerer_train.json").read_text())[TRAINED_ON]
    assert dev[0].fused_query not in json.dumps(record)  # digests, never the query text
    (fit,) = roles_fitted_on(resolved, dev)
    assert (fit.role, fit.model, fit.shared, fit.sampled) == (
        "user_answerer", "smollm2-135m-answerer", 5, len(dev),
    )  # fmt: skip
    assert fit.describe().startswith("role user_answerer (smollm2-135m-answerer) was fitted on 5")
    renamed = [i.model_copy(update={"id": f"x{n}", "fused_query": i.fused_query.upper()})
               for n, i in enumerate(dev[:2])]  # fmt: skip
    assert [f.shared for f in roles_fitted_on(resolved, renamed)] == [2]
    assert roles_fitted_on(resolved, dev[5:]) == []  # held out from the role: nothing to say


def test_the_shipped_role_adapters_record_the_train_split_they_were_fitted_on():
    train = load_instances(DatasetSource(path="sample", split="train"))
    resolved = load_experiment("quickstart")
    found = {f.role: (f.shared, f.source) for f in roles_fitted_on(resolved, train)}
    assert found == {
        "user_answerer": (24, "sample:train"),
        "rewriter": (24, "sample:train"),
        "searcher": (24, "sample:train"),
    }
    dev = load_instances(DatasetSource(path="sample", split="dev"))
    assert roles_fitted_on(resolved, dev) == []
