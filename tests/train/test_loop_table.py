"""The loop table against a hand computation: every figure of a row (score, Δ vs base, Δ vs
previous) stands on the instances every iteration scored, also when one iteration failed one."""

from __future__ import annotations

from pathlib import Path

import pytest

from cts.eval.data.dataset import load_instances
from cts.eval.data.schema import Record
from cts.eval.report.report import write_report
from cts.eval.report.summary import Summary
from cts.eval.run.config import load_experiment
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import Shard
from cts.eval.score.metrics import paired_test
from cts.train.loop import Iteration, markdown, table

CONDITIONS = ["blurred", "clarify@1", "oracle"]
FAILED = {"kind": "timeout", "stage": "search", "message": "slow"}
#: clarify@1 per iteration on instances 0..3 (None: failed). blurred 10, oracle 90 throughout.
CLARIFY: list[list[float | None]] = [
    [50.0, 40.0, 30.0, 20.0],
    [60.0, 50.0, 45.0, None],
    [70.0, 50.0, 45.0, 100.0],
]


def scored(instance: str, condition: str, score: float | None) -> Record:
    if score is None:
        return Record(instance_id=instance, condition=condition, seed=0, error=FAILED)
    scores = {"restore_score_100": score, "strict": score, "unweighted": score}
    return Record(instance_id=instance, condition=condition, seed=0, scores=scores)


def evaluation_runs(root: Path) -> list[Path]:
    """One evaluation run per iteration, like `cts train loop` leaves them."""
    resolved = load_experiment(
        None, ["conditions=[blurred, clarify@1, oracle]", "dataset.limit=4", "seeds=[0]"]
    )
    ids = [i.id for i in load_instances(resolved.experiment.dataset)]
    dirs = []
    for index, clarify in enumerate(CLARIFY):
        run_dir = root / "eval" / "main" / f"iter-{index}"
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(resolved.to_yaml())
        store = RecordStore(run_dir)
        for instance, score in zip(ids, clarify, strict=True):
            for record in (
                scored(instance, "blurred", 10.0),
                scored(instance, "clarify@1", score),
                scored(instance, "oracle", 90.0),
            ):
                store.append(record, Shard())
        dirs.append(run_dir)
    return dirs


def test_every_figure_of_a_row_stands_on_the_instances_every_iteration_scored(tmp_path):
    """Iteration 1 failed instance 3: the table stands on instances 0-2 (n 3) throughout.
    clarify@1 scores 40, 155/3, 55; Δ vs base 35/3 (10, 10, 15) and 15 (20, 10, 15: not
    31.25, which instance 3's 80 would make on the 4 instances iterations 0 and 2 share);
    Δ vs previous 35/3 and 10/3 (10, 0, 0); so Δ vs base = Δ vs previous + the previous Δ vs
    base. Sign-flip p on 3 instances, every flip enumerated: 2/8 when all differences share a
    sign, 1 for 10, 0, 0 (every flip as far from 0); one clarify@k, so p_holm = p."""
    dirs = evaluation_runs(tmp_path)
    files = write_report(dirs, tmp_path / "loop" / "main")
    summary = Summary.model_validate_json(files.summary_json.read_text())
    rows = table(summary, [Iteration(i, tmp_path, None) for i in range(3)], dirs)

    clarify = [row["scores"]["clarify@1"] for row in rows]
    assert [c["mean"] for c in clarify] == pytest.approx([40.0, 155 / 3, 55.0])
    assert [c["n"] for c in clarify] == [3, 3, 3]
    base = [row["delta_vs_base"]["clarify@1"] for row in rows[1:]]
    previous = [row["delta_vs_previous"]["clarify@1"] for row in rows[1:]]
    assert [d["difference"] for d in base] == pytest.approx([35 / 3, 15.0])
    assert [d["difference"] for d in previous] == pytest.approx([35 / 3, 10 / 3])
    assert [d["n"] for d in base + previous] == [3, 3, 3, 3]
    assert base[1]["difference"] == pytest.approx(previous[1]["difference"] + base[0]["difference"])
    assert [d["p_value"] for d in base] == [0.25, 0.25]
    assert [d["p_value"] for d in previous] == [0.25, 1.0]
    assert all(d["p_holm"] == d["p_value"] for d in base + previous)
    # The CI is the bootstrap of those same 3 differences (iteration 2 − base).
    expected = paired_test([70.0, 50.0, 45.0], [50.0, 40.0, 30.0])
    assert (base[1]["low"], base[1]["high"]) == pytest.approx((expected.low, expected.high))
    for row in rows[1:]:  # blurred and oracle never changed: 0 on the same 3
        for condition in ("blurred", "oracle"):
            assert (
                row["delta_vs_base"][condition]["difference"],
                row["delta_vs_base"][condition]["n"],
            ) == (0.0, 3)

    text = markdown(rows, "main")
    assert "and every Δ on the 3 instances every iteration scored" in text
    (line,) = [x for x in text.splitlines() if x.startswith("| 2 | clarify@1 |")]
    assert "| 55.0 [" in line and "| +15.0 [" in line and "| +3.3 [" in line
