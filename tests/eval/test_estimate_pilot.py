"""`cts estimate`'s pilot: a seeded sample stratified by language, then removed-constraint type
(checked by hand on the sample dev split), that says how it was drawn; and the model work of
records a retry replaced is counted."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tests.scripted_cts
from cts.cli import app
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.pilot import allocate, constraint_stratum, draw_pilot
from cts.serving.errors import EngineError
from cts.serving.types import ChatRequest
from tests.builders import scripted_cli
from tests.eval.test_estimate import fixed_cost_roles

runner = CliRunner()


@pytest.fixture(scope="module")
def dev():  # type: ignore[no-untyped-def]
    return load_instances(DatasetSource(path="sample", split="dev"))


def test_allocation_is_proportional_by_largest_remainder():
    rng = random.Random(0)
    assert allocate({"en": 20, "zh": 4}, 5, rng) == {"en": 4, "zh": 1}  # 4.17 / 0.83
    assert allocate({"en": 20, "zh": 4}, 2, rng) == {"en": 2, "zh": 0}  # 1.67 / 0.33
    assert allocate({"a": 1, "b": 1}, 5, rng) == {"a": 1, "b": 1}  # never more than held
    # Equal remainders: the larger stratum first.
    assert allocate({"big": 6, "small": 3}, 1, rng) == {"big": 1, "small": 0}


def test_the_pilot_of_five_is_a_stratified_draw_checked_by_hand(dev):
    # The sample dev split: 20 English, 4 Chinese. The first five instances (the old pilot)
    # are all English.
    assert [i.language for i in dev[:5]] == ["en"] * 5
    assert sum(i.language == "zh" for i in dev) == 4
    # By hand: 5 × 20/24 = 4.17 English, 5 × 4/24 = 0.83 Chinese → en 4, zh 1 (largest
    # remainder). English by type (definition 2, entity 4, numeric 3, region 4, region+time 1,
    # scope 1, scope+time 1, time 4): 4 × n/20 → entity, region, time 0.8, numeric 0.6, the
    # rest ≤ 0.4 → one each of entity, numeric, region, time. Chinese (numeric 1, region 2,
    # time 1): 1 × n/4 → region 0.5 → region.
    expected = {
        ("en", "entity"): 1,
        ("en", "numeric"): 1,
        ("en", "region"): 1,
        ("en", "time"): 1,
        ("zh", "region"): 1,
    }
    draws = [draw_pilot(dev, 5, seed) for seed in range(6)]
    for draw in draws:
        got: dict[tuple[str, str], int] = {}
        for i in draw.instances:
            got[(i.language, constraint_stratum(i))] = (
                got.get((i.language, constraint_stratum(i)), 0) + 1
            )
        assert got == expected
        assert [i.id for i in draw.instances] == [i.id for i in dev if i in draw.instances]
    assert draws[0].describe() == (
        "5 of the sweep's 24 instances, a sample stratified by language, then "
        "removed-constraint type, drawn with seed 0 (proportional allocation, largest "
        "remainder): en 4 (entity 1, numeric 1, region 1, time 1); zh 1 (region 1)"
    )
    # The seed draws the members of each stratum: the same seed, the same pilot.
    assert [i.id for i in draw_pilot(dev, 5, 0).instances] == [i.id for i in draws[0].instances]
    assert len({tuple(i.id for i in d.instances) for d in draws}) > 1
    whole = draw_pilot(dev, 30, 0)
    assert len(whole.instances) == 24 and whole.describe() == "all 24 instances of the sweep"


@pytest.fixture
def scripted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("COLUMNS", "250")
    return scripted_cli(tmp_path, monkeypatch, fixed_cost_roles)


SWEEP = ["--set", "dataset.limit=null", "--set", "cache.enabled=false"]
SWEEP += ["--set", "conditions=[blurred,oracle]"]


def test_cts_estimate_pilots_the_drawn_instances_and_says_how(scripted, dev):
    args = ["estimate", "--pilot", "5", "--pilot-dir", str(scripted / "pilot"), *SWEEP]
    result = runner.invoke(app, [*args, "--out", str(scripted / "e.json")])
    assert result.exit_code == 0, result.output
    how = draw_pilot(dev, 5, 0).describe()
    assert f"pilot: {how}" in " ".join(result.output.split())
    assert json.loads((scripted / "e.json").read_text())["pilot_drawn"] == how
    drawn = json.loads((scripted / "pilot" / "pilot.json").read_text())
    assert drawn["ids"] == [i.id for i in draw_pilot(dev, 5, 0).instances]
    ran = {
        json.loads(line)["instance_id"]
        for path in (scripted / "pilot" / "records").rglob("shard-*.jsonl")
        for line in path.read_text().splitlines()
    }
    assert ran == set(drawn["ids"]) and "D-dev-06" in ran  # the Chinese instance drawn
    other = runner.invoke(app, [*args, "--pilot-seed", "2", "--pilot-dir", str(scripted / "p2")])
    assert other.exit_code == 0, other.output
    assert json.loads((scripted / "p2" / "pilot.json").read_text())["ids"] != drawn["ids"]


def test_work_behind_records_a_retry_replaced_is_counted(scripted, monkeypatch):
    """The judge fails one key of A-dev-01 once (its nuggets name the Korvex Aura);
    `cts run --retry-failed` runs the key again. Without the response cache every request of
    the retry reaches its engine."""
    failed_once: set[str] = set()

    def roles():  # type: ignore[no-untyped-def]
        engines = fixed_cost_roles()
        judge = engines["judge"].script

        def flaky(request: ChatRequest) -> str | Exception:
            prompt = " ".join(m.content for m in request.messages)
            if "A-dev-01" not in failed_once and "Korvex Aura" in prompt:
                failed_once.add("A-dev-01")
                return EngineError("judge timed out")
            return judge(request)

        engines["judge"].script = flaky
        return engines

    monkeypatch.setattr(tests.scripted_cts, "scripted_roles", roles)
    run = scripted / "run"
    args = ["run", "--output-dir", str(run), "--limit", "2", *SWEEP[2:]]
    args += ["--set", "search.date=2026-11-30"]
    first = runner.invoke(app, args)
    assert "1 failed" in first.output, first.output
    assert runner.invoke(app, [*args, "--retry-failed"]).exit_code == 0
    out = scripted / "e.json"
    found = runner.invoke(app, ["estimate", "--from-run", str(run), *SWEEP, "--out", str(out)])
    assert found.exit_code == 0, found.output
    estimate = json.loads(out.read_text())
    # Per key: the searcher's 2 calls (40 prompt, 4 generated tokens each) and the judge's 1
    # (50, 5); 2 keys an instance → 6 calls, 260 prompt, 26 generated tokens. The replaced
    # attempt of A-dev-01's key adds its 2 searcher calls (the failed judge call answered
    # nothing): 8 calls, 340, 34. Mean per instance 7 calls, 300 prompt, 30 generated; the
    # sweep's 24 instances: 168 calls, 7,200 prompt, 720 generated tokens.
    assert estimate["calls"]["total"] == pytest.approx(168)  # 144 when they were dropped
    assert estimate["prompt_tokens"]["total"] == pytest.approx(7200)
    assert estimate["completion_tokens"]["total"] == pytest.approx(720)
    searcher = next(r for r in estimate["roles"] if r["role"] == "searcher")
    assert searcher["calls"]["total"] == pytest.approx(24 * 5)  # (6 + 4) / 2 per instance
    assert estimate["pilot_replaced"] == 1
    assert any("1 record(s) of the pilot were replaced" in n for n in estimate["notes"])
    assert "not drawn by `cts estimate`" in estimate["pilot_drawn"]
