"""`cts estimate --detect`: the plans from a pilot's noise, their keys and GPU-hours, by hand."""

from __future__ import annotations

import pytest

from cts.eval.cost import Figure, ModelRow
from cts.eval.data.schema import Record
from cts.eval.estimate import Estimate
from cts.eval.score.power import mde
from cts.eval.sweep_power import DetectError, detect, seed_scores

#: Pilot scores, instance → (blurred seeds 0, 1; clarify@1 seeds 0, 1).
PILOT = {
    "i1": ((10, 14), (30, 34)),
    "i2": ((40, 40), (50, 46)),
    "i3": ((0, 4), (0, 8)),
    "i4": ((60, 64), (90, 90)),
}


def pilot_records() -> list[Record]:
    records = []
    for instance, by_condition in PILOT.items():
        for condition, scores in zip(("blurred", "clarify@1"), by_condition, strict=True):
            for seed, score in enumerate(scores):
                records.append(
                    Record(
                        instance_id=instance,
                        condition=condition,
                        seed=seed,
                        scores={"restore_score_100": float(score)},
                    )
                )
    records.append(Record(instance_id="i5", condition="blurred", seed=0, error={"kind": "x"}))
    return records


def estimate_of(gpu_hours: float | None) -> Estimate:
    """A sweep of 200 instances × 2 conditions × 2 seeds = 800 keys, `gpu_hours` in all."""
    figure = None if gpu_hours is None else Figure(gpu_hours / 800, gpu_hours, 0, 0)
    model = ModelRow("m", "m", ["judge"], None, None, 1, figure, figure, 1, 1)
    return Estimate(
        "x", "pilot", 4, 16, 0, 200, ["blurred", "clarify@1"], [0, 1], 800, [], [model], [],
        [], None, None, None, 24.0, 1,
    )  # fmt: skip


def test_plans_from_a_pilot_by_hand():
    """D_i (clarify@1 − blurred, seed means) = 20, 8, 2, 28: mean 14.5, variance
    (5.5² + 6.5² + 12.5² + 13.5²)/3 = 411/3 = 137. Seed s seeds both conditions, so the seeds'
    part comes from the per-seed differences 20, 20; 10, 6; 0, 4; 30, 26: within (pooled
    squares over 4 degrees of freedom) (0 + 8 + 8 + 8)/4 = 6, the seeds' part at 2 seeds 3 (not
    (6 + 12)/2 = 9, the two conditions' own withins added as if their seeds were independent);
    the interaction 134."""
    found = detect(pilot_records(), estimate_of(80.0), 10.0)
    noise = found.noise
    assert found.between == ("clarify@1", "blurred") and noise.instances == 4
    assert noise.variance == pytest.approx(137.0)
    assert noise.seed_part == pytest.approx(3.0) and noise.interaction == pytest.approx(134.0)
    assert (found.family, found.plans.alpha) == (1, 0.05)  # one clarify@k: no Holm family
    cheapest = found.costs[0]
    assert cheapest.seeds == 1  # seeds are 2% of the noise: one seed is cheapest
    variance = 134.0 + 3.0 * 2  # at one seed the seeds' part doubles
    assert mde(variance, cheapest.instances) <= 10.0 < mde(variance, cheapest.instances - 1)
    # 80 GPU-hours over 800 keys: 0.1 a key, × instances × seeds × 2 conditions.
    assert cheapest.keys == cheapest.instances * 2
    assert cheapest.gpu_hours == pytest.approx(0.1 * cheapest.keys)
    assert any("more seeds cannot help" in n for n in found.plans.notes)
    assert detect(pilot_records(), estimate_of(None), 10.0).costs[0].gpu_hours is None


def test_the_dataset_too_small_and_a_pilot_that_cannot_say():
    small = detect(pilot_records(), estimate_of(80.0), 0.5)
    assert small.costs == [] and any("cannot detect 0.5 points" in n for n in small.plans.notes)
    with pytest.raises(DetectError, match="no condition clarify@3"):
        detect(pilot_records(), estimate_of(1.0), 5.0, between=("clarify@3", "blurred"))
    assert "i5" not in seed_scores(pilot_records(), "blurred")  # its seed failed


def test_bad_detect_options_are_refused_before_any_pilot_runs(tmp_path):
    from typer.testing import CliRunner

    from cts.cli import app

    for args, why in (
        (["--detect", "0"], "--detect 0.0: expected restore points > 0"),
        (["--detect", "3", "--detect-between", "clarify@1"], "two conditions, A,B"),
    ):
        result = CliRunner().invoke(app, ["estimate", "--pilot-dir", str(tmp_path / "p"), *args])
        assert result.exit_code == 2 and why in result.output, result.output
        assert not (tmp_path / "p").exists()  # no pilot was started


def test_plans_at_the_holm_familys_level_and_the_pilots_own_uncertainty():
    """A sweep with clarify@1..3: the report Holm-corrects the three rows of a pair, so the
    plans are made at α/3 (they need more instances than at α); and the pilot's 4 instances
    leave its noise uncertain: its 90% upper bound is (n − 1) / χ²_{0.1, n−1} = 3 / 0.5844 =
    5.13 times its variance, and each plan says what it would need then."""
    from dataclasses import replace

    from cts.eval.sweep_power import noise_upper_factor

    family = ["blurred", "clarify@1", "clarify@2", "clarify@3"]
    sweep = replace(estimate_of(80.0), conditions=family)
    found = detect(pilot_records(), sweep, 10.0)
    alone = detect(pilot_records(), estimate_of(80.0), 10.0)
    assert (found.family, found.alpha) == (3, 0.05)
    assert found.plans.alpha == pytest.approx(0.05 / 3)
    assert found.costs[0].instances > alone.costs[0].instances
    assert noise_upper_factor(4) == pytest.approx(5.133, abs=0.001)
    assert found.noisier == pytest.approx(noise_upper_factor(4))
    cheapest = found.costs[0]
    assert cheapest.instances_if_noisier is not None
    assert cheapest.instances_if_noisier > cheapest.instances
    assert detect(pilot_records(), sweep, 10.0, alpha=0.1).plans.alpha == pytest.approx(0.1 / 3)
