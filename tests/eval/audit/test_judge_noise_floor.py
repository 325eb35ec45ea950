"""The same judge does not give the same labels twice: `cts judge agreement` and `cts rejudge`
say how many labels and score points move when one judge re-reads the same answers (its noise
floor, with CIs over instances), beside every comparison of that judge with another. The
arithmetic against a hand computation; the judge told apart by its setup; end to end on a
scripted run, a same-judge rejudge whose judge re-reads one label differently and a rejudge
by another judge."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.audit.agreement import agreement, compare, movement
from cts.eval.audit.pairing import pair
from cts.eval.experiment import run_experiment
from cts.eval.run.fingerprint import judge_setup
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import RunDir
from cts.eval.score.metrics import ratio_ci
from cts.serving.scripted import scripted_roles
from cts.serving.types import ChatRequest
from tests.eval.audit.test_judge_agreement import judgement, record
from tests.eval.test_rejudge import NEW_JUDGE, make_source, rejudge


def first_and_second():
    """Two judgements of the same answers (A, B: instances; n1, n2: nuggets).

                      first            second          labels changed   restore score
    A blurred    full, none       none, none              1 of 2        50 → 0  (|Δ| 50)
    A oracle     full, full       full, full              0 of 2       100 → 100
    B blurred    none, none       none, none              0 of 2         0 → 0
    B oracle     partial, full    partial, full           0 of 2        75 → 75

    Labels: 1 of 8 moved (12.5%). Scores: 1 of 4 records moved, mean |Δ| = 50 / 4 = 12.5
    points per record. The CI resamples the 2 instances: AA (p = 1/4) gives 2/8 labels and
    100/4 points, AB (1/2) 1/8 and 12.5, BB (1/4) 0/8 and 0; the 2.5th percentile of the
    resamples is then BB's value and the 97.5th AA's: [0, 25%] and [0, 25] points."""
    rows = [
        ("A", "blurred", ("full", "none"), ("none", "none"), 50.0, 0.0),
        ("A", "oracle", ("full", "full"), ("full", "full"), 100.0, 100.0),
        ("B", "blurred", ("none", "none"), ("none", "none"), 0.0, 0.0),
        ("B", "oracle", ("partial", "full"), ("partial", "full"), 75.0, 75.0),
    ]
    first = [
        record(i, c, dict(zip(("n1", "n2"), a, strict=True)), score=s) for i, c, a, _, s, _ in rows
    ]
    second = [
        record(i, c, dict(zip(("n1", "n2"), b, strict=True)), score=t) for i, c, _, b, _, t in rows
    ]
    return first, second


def test_the_noise_floor_matches_the_hand_computation():
    first, second = first_and_second()
    moved = movement(pair(judgement("a", first), judgement("b", second)))
    assert (moved.labels, moved.changed, moved.records, moved.records_moved) == (8, 1, 4, 1)
    assert moved.share == pytest.approx(1 / 8) and moved.points == pytest.approx(12.5)
    assert (moved.share_low, moved.share_high) == (0.0, pytest.approx(2 / 8))
    assert (moved.points_low, moved.points_high) == (0.0, pytest.approx(25.0))
    assert moved.instances == 2


def test_ratio_ci_resamples_whole_clusters():
    # One cluster: nothing to resample. Equal ratios everywhere: the interval is that ratio.
    assert ratio_ci([1], [4]) == ratio_ci([1], [4], resamples=10)
    one = ratio_ci([1], [4])
    assert (one.mean, one.low, one.high, one.n) == (0.25, 0.25, 0.25, 1)
    same = ratio_ci([1, 2, 3], [4, 8, 12])
    assert (same.mean, same.low, same.high) == (0.25, 0.25, 0.25)
    with pytest.raises(ValueError):
        ratio_ci([1, 1], [2, 0])
    with pytest.raises(ValueError):
        ratio_ci([], [])


def test_a_pair_by_one_judge_is_its_noise_floor_shown_beside_another_judge():
    first, second = first_and_second()
    runs = [
        judgement("a", first, setup="judge-x", judge="x"),
        judgement("a-again", second, setup="judge-x", judge="x"),
        judgement("b", second, setup="judge-y", judge="y"),
    ]
    report = agreement(runs)
    pairs = {(p.first, p.second): p for p in report.pairs}
    assert pairs[("a", "a-again")].same_judge
    assert not pairs[("a", "b")].same_judge and not pairs[("a-again", "b")].same_judge
    (floor,) = report.noise_floors
    assert (floor.first, floor.second, floor.setup) == ("a", "a-again", "judge-x")
    assert floor.movement.changed == 1
    # Beside a and b, judge x's floor; judge y has none among the runs: a note says how.
    assert report.floors_for(pairs[("a", "b")]) == [floor]
    (note,) = [n for n in report.notes if "noise floor" in n]
    assert note.startswith("judge y (run b): no same-judge noise floor")
    assert "`cts rejudge b --output-dir b-again`" in note
    # A judgement of unknown setup is never taken for the same judge.
    unknown = compare(judgement("u", first), judgement("v", first))
    assert not unknown.same_judge


def cached(records, calls: int = 0):
    """The records as a run whose judge answered `calls` times and replayed one answer each
    from the response cache."""
    usage = {"judge_calls": calls, "judge_cached_calls": 1}
    return [r.model_copy(update={"usage": usage}) for r in records]


def test_a_same_judge_pair_whose_labels_are_cache_replays_is_no_noise_floor():
    first, second = first_and_second()
    fresh = cached(first, calls=1)
    # b's judge asked nothing: every label it holds is a cache replay.
    report = agreement(
        [
            judgement("a", fresh, setup="judge-x", judge="x"),
            judgement("b", cached(second), setup="judge-x", judge="x"),
        ]
    )
    (found,) = report.pairs
    assert not found.same_judge and found.replayed == "b" and report.noise_floors == []
    assert any("every label of b on the answers both judged came from the response cache" in n
               for n in report.notes)  # fmt: skip
    # Either side: a replayed first run is no reading either.
    found = compare(
        judgement("b", cached(second), setup="judge-x"), judgement("a", fresh, setup="judge-x")
    )
    assert not found.same_judge and found.replayed == "b"
    # One replayed record among fresh ones: the judge did read; a floor.
    mixed = [*cached(second[:1]), *cached(second[1:], calls=1)]
    found = compare(judgement("a", fresh, setup="judge-x"), judgement("b", mixed, setup="judge-x"))
    assert found.same_judge and found.replayed is None
    # A rejudge never reads a shared cache: its own-cache hits are its own readings.
    found = compare(
        judgement("a", fresh, setup="judge-x"),
        judgement("b", cached(second), setup="judge-x", source="a"),
    )
    assert found.same_judge and found.replayed is None


def test_cts_judge_agreement_refuses_a_run_given_twice_and_names_a_cached_rerun(
    tmp_path, monkeypatch
):
    source = make_source(tmp_path, monkeypatch, "judge.canary.enabled=false")
    twice = CliRunner().invoke(app, ["judge", "agreement", str(source), f"{source}/"])
    assert twice.exit_code == 2 and "are the same run directory" in twice.output, twice.output
    # A rerun of the same experiment: every judge answer replayed from the shared cache.
    rerun = tmp_path / "rerun"
    resolved = RunDir(source).read_config()
    result = run_experiment(resolved, rerun, show_progress=False)
    assert result.report is not None
    judged = [r for r in RecordStore(rerun).completed().values() if r.labels]
    assert judged and all(r.usage["judge_calls"] == 0 for r in judged)
    out = CliRunner().invoke(app, ["judge", "agreement", str(source), str(rerun)])
    text = " ".join(out.output.split())
    assert out.exit_code == 0, out.output
    assert "so this is its noise floor" not in text
    assert "the labels of rerun are response-cache replays, not a second reading" in text
    assert "source vs rerun: the same judge, but every label of rerun" in text


def test_the_judge_setup_ignores_how_the_model_is_reached_and_the_canary():
    base = {
        "experiment": {
            "roles": {"judge": {"model": "m", "sampling": {}}},
            "judge": {"show_query": False, "canary": {"share": 0.25}},
        },
        "models": {"m": {"name": "m", "path": "/w", "endpoint": "http://a", "max_batch_size": 8}},
        "fingerprint": {"prompts": "p"},
    }
    same = json.loads(json.dumps(base))
    same["models"]["m"].update(endpoint="http://b", max_batch_size=1)
    same["experiment"]["judge"]["canary"] = {"enabled": False}
    same["experiment"]["judge"]["deterministic"] = True
    same["models"]["other"] = {"name": "other", "path": "/o"}  # another role's model
    assert judge_setup(same) == judge_setup(base)
    for change in (
        lambda d: d["models"]["m"].update(path="/w2"),
        lambda d: d["experiment"]["judge"].update(show_query=True),
        lambda d: d["experiment"]["roles"]["judge"].update(sampling={"max_tokens": 9}),
        lambda d: d["fingerprint"].update(prompts="q"),
        # The judge's code (the lexical judge's rules): a rejudge under changed rules is
        # another judge, never its source's noise floor.
        lambda d: d["fingerprint"].update({"code:judge": "other rules"}),
    ):
        other = json.loads(json.dumps(base))
        change(other)
        assert judge_setup(other) != judge_setup(base)
    # Another part of the code (the clarifier's, the pipeline's) is not the judge.
    elsewhere = json.loads(json.dumps(base))
    elsewhere["fingerprint"]["code:eval/run"] = "edited"
    assert judge_setup(elsewhere) == judge_setup(base)
    assert judge_setup({"experiment": {"roles": {}}}) is None


def test_the_judge_setup_reads_the_judges_own_prompt_not_another_roles():
    base = {
        "experiment": {"roles": {"judge": {"model": "m"}}, "judge": {}},
        "models": {"m": {"name": "m", "path": "/w"}},
        "fingerprint": {
            "prompts": "every-prompt",
            "prompt:agents/judge.yaml": "j",
            "prompt:agents/clarifier.yaml": "c",
        },
    }
    clarifier_edited = json.loads(json.dumps(base))
    clarifier_edited["fingerprint"].update(
        {"prompts": "every-prompt-2", "prompt:agents/clarifier.yaml": "c2"}
    )
    assert judge_setup(clarifier_edited) == judge_setup(base)
    judge_edited = json.loads(json.dumps(clarifier_edited))
    judge_edited["fingerprint"].update({"prompt:agents/judge.yaml": "j2"})
    assert judge_setup(judge_edited) != judge_setup(base)


def test_a_judge_adapter_trained_again_in_place_is_another_judge():
    base = {
        "experiment": {"roles": {"judge": {"model": "m"}}, "judge": {}},
        "models": {"m": {"name": "m", "path": "/w", "adapter": "/a"}},
        "fingerprint": {"model:m:adapter": "a1", "model:other:path": "o1"},
    }
    other_role = json.loads(json.dumps(base))
    other_role["fingerprint"]["model:other:path"] = "o2"
    assert judge_setup(other_role) == judge_setup(base)
    retrained = json.loads(json.dumps(base))
    retrained["fingerprint"]["model:m:adapter"] = "a2"
    assert judge_setup(retrained) != judge_setup(base)
    # Written before model digests: the judge as its config names it, as before.
    older = json.loads(json.dumps(base))
    older["fingerprint"] = {}
    assert judge_setup(older) == judge_setup({**base, "fingerprint": {}})


def rereading_judge(request: ChatRequest) -> str:
    """The scripted judge, re-reading one nugget differently: `none` where it said `full`
    for the first id of the batch."""
    labels = json.loads(scripted_roles()["judge"].script(request))
    first = request.output.json_schema["required"][0]  # type: ignore[union-attr]
    labels[first]["label"] = "none"
    return json.dumps(labels)


def test_a_rejudge_by_the_same_judge_says_it_is_its_noise_floor(tmp_path, monkeypatch):
    source = make_source(tmp_path, monkeypatch, "judge.canary.enabled=false")
    again, _, _ = rejudge(source, tmp_path / "again", monkeypatch, [], judge=rereading_judge)
    other, _, _ = rejudge(source, tmp_path / "other", monkeypatch, NEW_JUDGE)
    assert again.against_source is not None and again.against_source.same_judge
    assert other.against_source is not None and not other.against_source.same_judge
    # What moved: the first nugget of each judged record whose source label was full.
    old, new = RecordStore(source).completed(), RecordStore(tmp_path / "again").completed()
    paired = [k for k, r in old.items() if r.error is None and new[k].error is None]
    changed = sum(
        old[k].labels[n]["label"] != new[k].labels[n]["label"]
        for k in paired
        for n in old[k].labels
    )
    moved = again.against_source.movement
    assert moved is not None and moved.changed == changed > 0
    assert moved.labels == sum(len(old[k].labels) for k in paired)

    result = CliRunner().invoke(
        app,
        ["judge", "agreement", str(source), str(tmp_path / "again"), str(tmp_path / "other")],
    )
    assert result.exit_code == 0, result.output
    assert "so this is its noise floor: labels moved" in result.output
    assert f"labels moved {changed} of {moved.labels}" in result.output
    assert "beside: same-judge noise floor of smollm2-135m-instruct (source vs again)" in (
        " ".join(result.output.split())
    )
    # The new judge (qwen3-8b) was read once only: the note says how to measure its floor.
    note = f"judge qwen3-8b (run {tmp_path / 'other'}): no same-judge noise floor"
    assert note in " ".join(result.output.split())


def test_a_same_judge_rejudge_after_another_roles_prompt_is_edited_is_its_noise_floor(
    tmp_path, monkeypatch
):
    import cts.eval.run.fingerprint

    source = make_source(tmp_path, monkeypatch, "judge.canary.enabled=false")
    shipped = cts.eval.run.fingerprint._prompt_files()

    def clarifier_edited() -> list[tuple[str, bytes]]:
        return [(n, t + b"# edited" if n == "agents/clarifier.yaml" else t) for n, t in shipped]

    monkeypatch.setattr(cts.eval.run.fingerprint, "_prompt_files", clarifier_edited)
    again, _, _ = rejudge(source, tmp_path / "again", monkeypatch, [], judge=rereading_judge)
    assert again.against_source is not None and again.against_source.same_judge
    # The judge's own prompt edited: another judge.
    monkeypatch.setattr(
        cts.eval.run.fingerprint,
        "_prompt_files",
        lambda: [(n, t + b"# edited" if n == "agents/judge.yaml" else t) for n, t in shipped],
    )
    other, _, _ = rejudge(source, tmp_path / "other", monkeypatch, [], judge=rereading_judge)
    assert other.against_source is not None and not other.against_source.same_judge


def test_cts_rejudge_prints_the_movement_against_its_source(tmp_path, monkeypatch):
    import cts.eval.rejudge
    from tests.eval.test_rejudge import engines_of

    source = make_source(tmp_path, monkeypatch)
    roles = scripted_roles()
    roles["judge"].script = rereading_judge
    monkeypatch.setattr(cts.eval.rejudge, "open_engines", engines_of(roles))
    same = CliRunner().invoke(app, ["rejudge", str(source), "--output-dir", str(tmp_path / "s")])
    assert same.exit_code == 0, same.output
    text = " ".join(same.output.split())
    assert "against the source, with the same judge (so this is its same-judge noise floor): " in (
        text
    )
    assert "labels moved " in text and "95% CIs over 2 instances" in text
    other = CliRunner().invoke(
        app, ["rejudge", str(source), "--output-dir", str(tmp_path / "o"), "--set", NEW_JUDGE[0]]
    )
    assert other.exit_code == 0, other.output
    text = " ".join(other.output.split())
    assert "against the source's judge: labels moved" in text
    assert f"`cts rejudge {source} --output-dir X` with the source's judge" in text
