"""Key slots and the streamed dialogue: a key waiting on a dialogue another key asks holds no
slot, clarify@j goes on when its j turns are there, and each turn is charged to one key."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Record
from cts.eval.run.dialogue import Clarification, DialogueStore
from cts.eval.run.pipeline import run_instance
from cts.eval.run.records import RecordStore
from cts.eval.run.runner import run_keys
from cts.eval.run.slots import KeySlots, released
from cts.eval.run.usage import metered
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import ChatRequest, ChatResponse
from tests.scripted import scripted_context

#: A hang guard, not a timing assertion: without the behaviour under test the run deadlocks.
HANG_S = 60


def instances(n: int = 1):  # type: ignore[no-untyped-def]
    return load_instances(DatasetSource(path="sample", split="dev", limit=n))


class Gated(ScriptedEngine):
    """A scripted engine whose request waits for `gate(request)` (an awaitable) when it
    returns one."""

    def __init__(self, inner: ScriptedEngine, gate: Callable[[ChatRequest], object]) -> None:
        super().__init__(inner.script, name=inner.model)
        self.gate = gate

    async def _complete(self, request: ChatRequest) -> ChatResponse:
        waited = self.gate(request)
        if waited is not None:
            await waited  # type: ignore[misc]
        return await super()._complete(request)


def asked_before(request: ChatRequest) -> int:
    """How many turns the dialogue in a clarifier request already has (as cts/serving/scripted.py
    reads it)."""
    return request.messages[-1].content.count("\nQ")


def run(search, tmp_path, conditions, concurrency, gate, on_done=None, searching=None):  # type: ignore[no-untyped-def]
    """The keys of one instance and seed 0, with the clarifier's requests gated by `gate` and
    `searching` seeing each searcher request; (records by condition, clarifier, roles)."""
    ctx, roles = scripted_context(search, store=DialogueStore(tmp_path / "dialogues", "s"))
    clarifier = Gated(roles["clarifier"], gate)
    ctx.clarification.roles["clarifier"] = clarifier
    if searching is not None:
        script = roles["searcher"].script
        roles["searcher"].script = lambda r: (searching(r), script(r))[1]
    store = RecordStore(tmp_path)
    asyncio.run(
        asyncio.wait_for(
            run_keys(
                instances(),
                conditions,
                [0],
                lambda i, c, s: run_instance(i, c, s, ctx),
                store,
                concurrency=concurrency,
                on_done=on_done,
            ),
            HANG_S,
        )
    )
    return {r.condition: r for r in store.completed().values()}, clarifier, roles


def test_clarify_at_1_is_recorded_before_the_second_question_is_asked(search, tmp_path):
    recorded = asyncio.Event()

    def gate(request: ChatRequest):  # type: ignore[no-untyped-def]
        return recorded.wait() if asked_before(request) >= 1 else None

    def on_done(record: Record) -> None:
        if record.condition == "clarify@1":
            recorded.set()

    records, clarifier, _ = run(
        search, tmp_path, ["clarify@1", "clarify@2", "clarify@3"], 4, gate, on_done
    )
    assert all(r.error is None for r in records.values())
    assert [len(records[f"clarify@{k}"].questions) for k in (1, 2, 3)] == [1, 2, 3]
    assert len(clarifier.requests) == 3


def test_a_key_waiting_on_another_keys_dialogue_gives_its_slot_away(search, tmp_path):
    """2 slots: clarify@1 asks the dialogue (and keeps its slot), clarify@3 only waits on it,
    so blurred gets the second slot and searches while the dialogue is held up."""
    blurred_searched = asyncio.Event()
    blurred = instances()[0].blurred_query

    def gate(request: ChatRequest):  # type: ignore[no-untyped-def]
        return blurred_searched.wait() if asked_before(request) >= 1 else None

    def searching(request: ChatRequest) -> None:
        if (
            blurred in request.messages[1].content
            and "rewritten" not in request.messages[1].content
        ):
            blurred_searched.set()

    records, _, _ = run(
        search, tmp_path, ["clarify@1", "clarify@3", "blurred"], 2, gate, searching=searching
    )
    assert all(r.error is None for r in records.values())
    assert len(records["clarify@3"].questions) == 3


def test_each_turn_is_charged_to_the_first_key_that_takes_it(search, tmp_path):
    ctx, roles = scripted_context(search, store=DialogueStore(tmp_path / "dialogues", "s"))
    metered_roles = {role: metered(engine, role) for role, engine in roles.items()}
    ctx.clarification = Clarification(
        metered_roles, ctx.sampling, k_max=3, store=DialogueStore(tmp_path / "dialogues", "s")
    )
    store = RecordStore(tmp_path)
    conditions = ["clarify@1", "clarify@2", "clarify@3"]
    asyncio.run(
        run_keys(instances(), conditions, [0], lambda i, c, s: run_instance(i, c, s, ctx), store)
    )
    records = {r.condition: r for r in store.completed().values()}
    assert [records[c].usage["clarifier_calls"] for c in conditions] == [1, 1, 1]
    assert [records[c].usage["user_answerer_calls"] for c in conditions] == [1, 1, 1]
    assert len(roles["clarifier"].requests) == 3


async def _slots_scenario() -> list[str]:
    """n=1: `a` gives its slot back while it waits; `b` (new) takes it; when `a`'s wait ends
    it queues before `c`, a key that has not started."""
    slots = KeySlots(1)
    order: list[str] = []
    wait_over = asyncio.Event()

    async def a() -> None:
        async with slots.held():
            order.append("a starts")
            async with released():
                await wait_over.wait()
            order.append("a resumes")

    async def b() -> None:
        async with slots.held():
            order.append("b starts")
            wait_over.set()
            await asyncio.sleep(0)
            order.append("b ends")

    async def c() -> None:
        async with slots.held():
            order.append("c starts")

    await asyncio.gather(a(), b(), c())
    return order


def test_a_key_back_from_a_wait_goes_before_keys_that_have_not_started():
    assert asyncio.run(_slots_scenario()) == [
        "a starts",
        "b starts",
        "b ends",
        "a resumes",
        "c starts",
    ]


def test_cancelled_keys_leave_every_slot_free():
    async def scenario() -> int:
        slots = KeySlots(2)
        forever = asyncio.Event()

        async def key(wait_released: bool) -> None:
            async with slots.held():
                if wait_released:
                    async with released():
                        await forever.wait()
                else:
                    await forever.wait()

        tasks = [asyncio.create_task(key(i % 2 == 0)) for i in range(6)]
        await asyncio.sleep(0.01)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Every slot can be taken again, at once.
        for _ in range(2):
            await asyncio.wait_for(slots.acquire(), HANG_S)
        return slots._free

    assert asyncio.run(scenario()) == 0
