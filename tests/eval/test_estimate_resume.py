"""`cts estimate`'s pilot stopped part-way and resumed counts what the same pilot run without
a stop counts: every role's calls and tokens, key for key.

The stop is a dead server: the Nth real call of one role's scripted engine raises
ServerUnreachable, which stops the run at that call whatever the machine's speed, with keys in
flight (their calls made so far are in the pilot's own response cache) and sequential dialogues
saved in dialogues/ ahead of the keys that take their turns. The same command then resumes the
pilot on healthy engines. Before the fix the resumed estimate lost the dialogue turns read back
from dialogues/ (charged to no key) and the calls of the keys in flight (answered on resume by
the pilot's cache, which counts as no work)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import tests.scripted_cts
from cts.eval.data.schema import Record
from cts.eval.pilot_records import with_dialogues
from cts.eval.run.dialogue import LineUsage
from cts.serving.errors import ServerUnreachable
from cts.serving.scripted import ScriptedEngine, scripted_roles
from cts.serving.types import ChatRequest
from tests.builders import cts, scripted_cli

#: 3 drawn instances × 4 conditions × 2 seeds; the pilot's own response cache on (as the
#: command sets it), so that a resumed key finds what its stopped attempt asked.
PILOT = ["--pilot", "3", "--set", "dataset.limit=null", "--set", "seeds=[0,1]"]
PILOT += ["--set", "conditions=[blurred,clarify@1,clarify@2,oracle]"]
PILOT += ["--set", "judge.canary.enabled=false"]


def dying(role: str, at_call: int) -> Callable[[], dict[str, ScriptedEngine]]:
    """Scripted roles whose `role` finds its server gone at its `at_call`-th real call."""

    def roles() -> dict[str, ScriptedEngine]:
        engines = scripted_roles()
        script = engines[role].script
        calls = 0

        def dies(request: ChatRequest) -> str | Exception:
            nonlocal calls
            calls += 1
            if calls == at_call:
                return ServerUnreachable(f"{role}: connection refused")
            return script(request)

        engines[role].script = dies
        return engines

    return roles


def estimate(work: Path, name: str) -> dict:
    """`cts estimate` of the pilot into work/name; the estimate's JSON."""
    out = work / f"{name}.json"
    result = cts("estimate", *PILOT, "--pilot-dir", str(work / name), "--out", str(out))
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def per_role(found: dict) -> dict[str, tuple[float, float, float]]:
    return {
        r["role"]: (
            r["calls"]["total"],
            r["prompt_tokens"]["total"],
            r["completion_tokens"]["total"],
        )
        for r in found["roles"]
    }


@pytest.mark.parametrize(
    "role, at_call",
    [
        ("rewriter", 1),  # the first clarify key past its turns: dialogues ahead of records
        ("searcher", 12),  # later: some keys recorded, others in flight mid-search
        ("user_answerer", 2),  # a dialogue cut mid-turn, its question asked and cached
    ],
)
def test_a_stopped_and_resumed_pilot_counts_what_an_uninterrupted_one_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, role: str, at_call: int
) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    scripted_cli(tmp_path, monkeypatch, scripted_roles)
    whole = estimate(tmp_path, "whole")

    monkeypatch.setattr(tests.scripted_cts, "scripted_roles", dying(role, at_call))
    args = ["estimate", *PILOT, "--pilot-dir", str(tmp_path / "cut")]
    stopped = cts(*args)
    assert stopped.exit_code == 1 and "connection refused" in stopped.output, stopped.output
    pilot = tmp_path / "cut"
    assert list((pilot / "dialogues").glob("*.jsonl")), "no dialogue was saved before the stop"
    recorded = sum(
        len(path.read_text().splitlines()) for path in (pilot / "records").rglob("*.jsonl")
    )
    assert recorded < 3 * 4 * 2  # stopped part-way
    assert list((pilot / "unrecorded").rglob("*.jsonl")), "no key was in flight at the stop"

    monkeypatch.setattr(tests.scripted_cts, "scripted_roles", scripted_roles)
    resumed = estimate(tmp_path, "cut")

    assert per_role(resumed) == per_role(whole)
    assert per_role(whole)["clarifier"][0] > 0 and per_role(whole)["user_answerer"][0] > 0
    for figure in ("calls", "prompt_tokens", "completion_tokens"):
        assert resumed[figure]["total"] == whole[figure]["total"], figure
    assert resumed["pilot_unrecorded"] > 0
    assert any("the pilot was stopped and resumed" in note for note in resumed["notes"])


def _key(condition: str, **usage: int) -> Record:
    return Record(instance_id="a", condition=condition, seed=0, usage=usage)


def test_a_dialogues_lines_replace_its_keys_share_turn_by_turn():
    """Turn j counts under the sweep's first clarify@k with k ≥ j; a turn no condition asks is
    left out; the clarify records lose their dialogue roles, keep the rest; a dialogue with a
    line from before lines recorded calls counts from the records, as before."""
    keys = [
        _key("blurred", searcher_calls=2),
        _key("clarify@1", clarifier_calls=1, rewriter_calls=1),
        _key("clarify@3", clarifier_calls=0, rewriter_calls=1),
    ]
    lines: list[LineUsage | None] = [
        LineUsage(turn=j, roles={"clarifier_calls": 1, "user_answerer_calls": 1}) for j in (1, 2)
    ]
    lines.append(LineUsage(turn=3, roles={"clarifier_calls": 1}))  # the stop at turn 3
    lines.append(LineUsage(turn=3, roles={}))  # a line that asked nothing more
    conditions = ["blurred", "clarify@1", "clarify@3"]
    work = with_dialogues(keys, [], {("a", 0): lines}, conditions)
    assert [r.usage for r in work.records] == [
        {"searcher_calls": 2},
        {"rewriter_calls": 1},
        {"rewriter_calls": 1},
    ]
    assert [(r.condition, r.usage.get("clarifier_calls")) for r in work.added] == [
        ("clarify@1", 1),
        ("clarify@3", 1),
        ("clarify@3", 1),
        ("clarify@3", None),
    ]
    # A sweep of clarify@1 alone: turns 2 and 3 are not its work.
    one = with_dialogues(keys[:2], [], {("a", 0): lines}, ["blurred", "clarify@1"])
    assert [r.condition for r in one.added] == ["clarify@1"]
    # An attempt added to a key (a replaced or unrecorded one) loses its turns too.
    cut = _key("clarify@1", clarifier_calls=1, rewriter_calls=1)
    assert with_dialogues(keys, [cut], {("a", 0): lines}, ["clarify@1"]).added[0].usage == {
        "rewriter_calls": 1
    }
    old = with_dialogues(keys, [], {("a", 0): [None, *lines]}, conditions)
    assert old.records == keys and old.added == []
