"""Which key starts next (cts/eval/run/schedule.py, cts/eval/run/slots.py): the longest expected
chain first, ranked by what the run measures, and the dataset's order on request."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cts.eval.data.schema import Instance, Record
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import Shard
from cts.eval.run.runner import run_keys
from cts.eval.run.schedule import CLARIFY, KeyCosts, group_of
from cts.eval.run.slots import KeySlots

CONDITIONS = ["blurred", "clarify@1", "clarify@3", "oracle"]


def record(condition: str, seconds: float, error: bool = False, instance: str = "x") -> Record:
    return Record(
        instance_id=instance,
        condition=condition,
        seed=0,
        language="en",
        seconds=seconds,
        error={"kind": "server_error", "stage": "search", "message": "x"} if error else None,
    )


def test_expected_costs_by_hand():
    """Priors (clarify 1 + 0.5 × 3 = 2.5 searches, the others 1), then measured means, an
    unmeasured group scaled by what the measured ones took per prior unit."""
    assert [group_of(c) for c in CONDITIONS] == ["blurred", CLARIFY, CLARIFY, "oracle"]
    costs = KeyCosts()
    assert (costs.expected(CLARIFY), costs.expected("blurred")) == (2.5, 1.0)
    costs.observe(record("blurred", 10.0))
    costs.observe(record("blurred", 14.0))
    costs.observe(record("blurred", 999.0, error=True))  # stopped early: says nothing
    assert costs.expected("blurred") == 12.0
    assert costs.expected(CLARIFY) == 2.5 * 12.0 and costs.expected("oracle") == 12.0
    costs.observe(record("clarify@1", 6.0))
    costs.observe(record("clarify@3", 30.0))
    assert costs.expected(CLARIFY) == 18.0
    # oracle: (10 + 14 + 6 + 30) s over (1 + 1 + 2.5 + 2.5) prior units.
    assert costs.expected("oracle") == pytest.approx(60.0 / 7.0)


def test_a_free_slot_goes_to_the_group_ranked_highest_when_it_frees():
    async def scenario() -> list[str]:
        ranks = {"short": 1.0, "long": 5.0}
        slots = KeySlots(1, ranks.__getitem__)
        started: list[str] = []
        gate = asyncio.Event()

        async def key(name: str, group: str) -> None:
            async with slots.held(group):
                started.append(name)
                if name == "first":
                    await gate.wait()
                elif name == "long-1":
                    ranks["short"] = 9.0  # measured: short keys now cost more

        tasks = [asyncio.create_task(key("first", "short"))]
        await asyncio.sleep(0)
        for name, group in (("short-1", "short"), ("long-1", "long"), ("short-2", "short")):
            tasks.append(asyncio.create_task(key(name, group)))
            await asyncio.sleep(0)
        tasks.append(asyncio.create_task(key("long-2", "long")))
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(*tasks)
        return started

    assert asyncio.run(scenario()) == ["first", "long-1", "short-1", "short-2", "long-2"]


def _start_order(tmp_path: Path, done: list[Record], **options) -> list[tuple[str, str]]:
    instances = [
        Instance(id=f"q{i}", blurred_query="b?", fused_query="f?", removed_constraints=["time"])
        for i in range(3)
    ]
    store = RecordStore(tmp_path)
    for r in done:
        store.append(r, Shard())
    started: list[tuple[str, str]] = []

    async def run_one(instance: Instance, condition: str, seed: int) -> Record:
        started.append((instance.id, condition))
        await asyncio.sleep(0)
        return record(condition, 1.0, instance=instance.id)

    asyncio.run(run_keys(instances, CONDITIONS, [0], run_one, store, concurrency=1, **options))
    return started


def test_keys_start_longest_first_and_in_the_datasets_order_on_request(tmp_path: Path):
    ranked = _start_order(tmp_path / "ranked", [])
    clarify = [k for k in ranked if k[1].startswith("clarify@")]
    # Every clarify key first, each instance's clarify@1 before its clarify@3 (the dialogue's
    # turns are charged to the first key that takes them), then blurred and oracle.
    assert ranked[:6] == clarify == [(f"q{i}", c) for i in range(3) for c in CONDITIONS[1:3]]
    assert {c for _, c in ranked[6:]} == {"blurred", "oracle"}
    given = _start_order(tmp_path / "given", [], key_order="dataset")
    assert given == [(f"q{i}", c) for i in range(3) for c in CONDITIONS]


def test_a_resumed_run_ranks_by_the_times_it_measured(tmp_path: Path):
    """Its finished keys say blurred took 100 s and clarify 1 s: blurred goes first."""
    done = [record("blurred", 100.0, instance="q0"), record("clarify@1", 1.0, instance="q0")]
    order = _start_order(tmp_path, done)
    assert order[:2] == [("q1", "blurred"), ("q2", "blurred")]
    assert ("q0", "blurred") not in order and len(order) == 12 - 2
