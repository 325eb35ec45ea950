"""End-to-end, the scores see quality: a `cts run` of the sample benchmark whose searcher
answers the fused query with the instance's facts and the blurred one with nothing gets the
hand-computed restore scores from the quickstart's own judge (the lexical judge): 100 for
oracle, 0 for blurred. A pipeline that lost the answer on its way to the judge, a judge that
lost the nuggets, or scoring that ignored the labels would all fail here.

The searcher replays answers (serving/scripted.py) so that what it says is known; the
dataset, the pipeline, the runner, the judge and the scoring are the real ones."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from cts.cli import app
from eval.data.dataset import DatasetSource, load_instances
from eval.run.runner import RecordStore

NOTHING = "I could not find reliable information about this."


def answer(text: str) -> str:
    return f"<think>\nfound it\n</think>\n<answer>\n{text}\n</answer>"


def test_an_answer_stating_the_nuggets_scores_100_and_one_stating_none_scores_0(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    instances = load_instances(DatasetSource(path="sample", split="dev", limit=2))
    replay = tmp_path / "searcher.jsonl"
    lines = [
        {"text": answer(" ".join(n.text for n in i.golden.nuggets)), "contains": i.fused_query}
        for i in instances
    ]
    lines.append({"text": answer(NOTHING)})  # any other request: the blurred queries
    replay.write_text("".join(json.dumps(line) + "\n" for line in lines))
    scripted = {
        role: {"name": f"scripted-{role}", "path": "none", "engine": "scripted", "script": role}
        for role in ("clarifier", "user_answerer", "rewriter", "summarizer")
    }
    searcher = {"name": "replay", "path": "none", "engine": "scripted", "replay": str(replay)}
    config = tmp_path / "experiment.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "quality",
                "roles": {
                    **{role: {"model": f"scripted-{role}"} for role in scripted},
                    "searcher": {"model": "replay"},
                    "judge": {"model": "lexical-judge"},
                },
                "models": {**{m["name"]: m for m in scripted.values()}, "replay": searcher},
                "dataset": {"path": "sample", "split": "dev", "limit": 2},
                "search": {"backend": "local", "corpus": "sample"},
                "conditions": ["blurred", "oracle"],
                "seeds": [0],
            }
        )
    )
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "-c", str(config), "--output-dir", str(run_dir)])
    assert result.exit_code == 0, result.output

    records = RecordStore(run_dir).completed()
    assert len(records) == 4 and all(r.error is None for r in records.values())
    for instance in instances:
        oracle = records[(instance.id, "oracle", 0)]
        blurred = records[(instance.id, "blurred", 0)]
        # Every nugget stated verbatim: all full, 100 by any weighting; none stated: 0.
        assert {v["label"] for v in oracle.labels.values()} == {"full"}
        assert oracle.scores == {"restore_score_100": 100.0, "strict": 100.0, "unweighted": 100.0}
        assert {v["label"] for v in blurred.labels.values()} == {"none"}
        assert blurred.scores["restore_score_100"] == 0.0
        nugget = instance.golden.nuggets[0]
        assert oracle.labels[nugget.id]["evidence"] == nugget.text[:120]
    summary = json.loads((run_dir / "summary.json").read_text())
    print(json.dumps(summary["systems"], indent=1)[:1500])
