"""`engine: scripted` in a model config: the rules of `cts/serving/scripted.py` or a replay file,
so that a user can test a config and the whole pipeline without weights."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from cts.eval.experiment import RunResult, run_experiment
from cts.eval.report.frame import records_frame, records_table
from cts.eval.run.config import load_experiment
from cts.eval.run.records import RecordStore
from cts.foundation.yaml_config import ConfigError
from cts.serving.download import hub_models
from cts.serving.errors import EngineError
from cts.serving.model_config import build_engine, load_model_config
from cts.serving.scripted import SCRIPTED_ROLES, ScriptedEngine, scripted_roles
from cts.serving.types import ChatRequest

ROLES = ["clarifier", "user_answerer", "rewriter", "searcher", "summarizer", "judge"]


def model_file(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump({"name": "m", "path": "scripted", **fields}))
    return path


def ask(engine: object, text: str) -> str:
    assert isinstance(engine, ScriptedEngine)
    request = ChatRequest.of([{"role": "user", "content": text}])
    return asyncio.run(engine.chat(request)).text


def test_every_scripted_role_can_be_named():
    assert set(SCRIPTED_ROLES) == set(scripted_roles())


def test_a_script_names_the_rules_of_one_role(tmp_path):
    config = load_model_config(model_file(tmp_path, engine="scripted", script="searcher"))
    engine = build_engine(config)
    assert isinstance(engine, ScriptedEngine)
    assert engine.script(ChatRequest.of([{"role": "user", "content": "x"}])) == (
        scripted_roles()["searcher"].script(ChatRequest.of([{"role": "user", "content": "x"}]))
    )
    assert engine.identity == "scripted:rules:searcher"
    assert hub_models({"m": config}) == {}  # no weights to download


def test_a_replay_file_answers_with_its_first_matching_line(tmp_path):
    replay = tmp_path / "answers.jsonl"
    lines = [{"contains": "capital", "text": "Paris"}, {"text": "I do not know"}]
    replay.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    engine = build_engine(
        load_model_config(model_file(tmp_path, engine="scripted", replay=str(replay)))
    )
    assert ask(engine, "the capital of France?") == "Paris"
    assert ask(engine, "anything else") == "I do not know"
    replay.write_text(json.dumps(lines[0]) + "\n")
    only = build_engine(
        load_model_config(model_file(tmp_path, engine="scripted", replay=str(replay)))
    )
    with pytest.raises(EngineError, match="no replay line matches"):
        ask(only, "anything else")
    assert isinstance(only, ScriptedEngine) and isinstance(engine, ScriptedEngine)
    assert only.identity != engine.identity  # an edited file is a new engine to the cache


def test_a_bad_replay_line_is_named_by_file_and_line(tmp_path):
    replay = tmp_path / "answers.jsonl"
    replay.write_text('{"text": "ok"}\n{"txt": "typo"}\n')
    with pytest.raises(ConfigError, match=r"answers\.jsonl:2: "):
        build_engine(load_model_config(model_file(tmp_path, engine="scripted", replay=str(replay))))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"engine": "scripted"}, "exactly one of `script` and `replay`"),
        ({"engine": "scripted", "script": "oracle"}, "not a scripted role"),
        ({"engine": "transformers", "script": "judge"}, "for engine 'scripted' only"),
    ],
)
def test_a_scripted_config_without_a_valid_script_is_refused(tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message):
        load_model_config(model_file(tmp_path, **fields))


def scripted_run(tmp_path: Path) -> tuple[Path, RunResult]:
    """The quickstart's shape on scripted model configs: 1 instance × 5 conditions."""
    models = tmp_path / "models"
    models.mkdir()
    for role in ROLES:
        (models / f"scripted-{role}.yaml").write_text(
            yaml.safe_dump(
                {
                    "name": f"scripted-{role}",
                    "path": "scripted",
                    "engine": "scripted",
                    "script": role,
                }
            )
        )
    experiment = tmp_path / "experiments" / "scripted.yaml"
    experiment.parent.mkdir()
    experiment.write_text(
        yaml.safe_dump(
            {
                "name": "scripted",
                "roles": {role: {"model": f"../models/scripted-{role}.yaml"} for role in ROLES},
                "dataset": {"path": "sample", "split": "dev", "limit": 1},
                "search": {"backend": "local", "corpus": "sample", "top_k": 3},
                "budgets": {"max_llm_calls": 3, "max_context_tokens": 6144},
                "seeds": [0],
                "cache": {"path": str(tmp_path / "responses.sqlite")},
            }
        )
    )
    resolved = load_experiment(experiment, [f"search.tool_cache={tmp_path / 'tools.sqlite'}"])
    return tmp_path / "run", run_experiment(resolved, tmp_path / "run", show_progress=False)


def test_a_whole_run_on_scripted_model_configs_needs_no_weights(tmp_path):
    _, result = scripted_run(tmp_path)
    records = RecordStore(tmp_path / "run").completed()
    assert result.outcome.failures == {}
    assert len(records) == 5
    assert all(r.error is None and "restore_score_100" in r.scores for r in records.values())
    assert result.report is not None and result.report.summary_json.exists()


def test_bench_imports_nothing_from_tests():
    root = Path(__file__).resolve().parents[2]
    found = [
        str(path.relative_to(root))
        for path in sorted((root / "bench").glob("*.py"))
        if any(
            line.strip().startswith(("from tests", "import tests"))
            for line in path.read_text().splitlines()
        )
    ]
    assert found == []


def test_a_runs_records_as_a_frame_hold_what_the_records_say(tmp_path):
    """cts.eval.report.frame: one row per record, sorted by key, scores and usage as columns; the
    mean per condition is the records' own mean (computed here from the records)."""
    run, _ = scripted_run(tmp_path)
    records = sorted(RecordStore(run).completed().values(), key=lambda r: r.key)
    frame = records_frame(run)
    assert list(frame.columns[:3]) == ["instance_id", "condition", "seed"]
    assert [tuple(row) for row in frame[["instance_id", "condition", "seed"]].values] == [
        r.key for r in records
    ]
    assert list(frame["restore_score_100"]) == [r.scores["restore_score_100"] for r in records]
    assert list(frame["usage.judge_calls"]) == [r.usage["judge_calls"] for r in records]
    assert list(frame["questions"]) == [len(r.questions) for r in records]
    assert frame["error_kind"].isna().all()
    by_condition = frame.groupby("condition")["restore_score_100"].mean().to_dict()
    assert by_condition == {r.condition: r.scores["restore_score_100"] for r in records}
    # The plain rows hold the same values; the frame fills a counter a record lacks with NaN.
    for row, framed in zip(records_table(run), frame.to_dict("records"), strict=True):
        assert row == {name: framed[name] for name in row}
