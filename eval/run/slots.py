"""Key slots: at most `n` evaluation keys at work at once.

A key that waits on work another task does for it (the clarify@k keys of an instance and seed
wait on one shared dialogue, eval/run/dialogue.py) gives its slot back while it waits, so that a
waiting key never keeps a request out of the servers: bench/pipeline.py measured 3 slots held
for 1 request in flight per clarified instance. When the wait ends the key takes the next free
slot before any key that has not started, so that started keys finish (and are recorded) first.
The engines bound the requests each server sees (`max_concurrency`); slots bound the keys whose
state is in memory.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar

#: Waiters that already held a slot go before new keys.
_RESUMED, _NEW = 0, 1


class KeySlots:
    def __init__(self, n: int) -> None:
        self._free = n
        #: Waiters by priority, then arrival; a cancelled one stays until popped.
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    async def acquire(self, resumed: bool = False) -> None:
        if self._free > 0:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (_RESUMED if resumed else _NEW, next(self._order), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                # Handed a slot just as it was cancelled: pass the slot on.
                self.release()
            raise

    def release(self) -> None:
        """Hand the slot to the first live waiter, or free it (then no one is waiting)."""
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)
                return
        self._free += 1

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Run a key in a slot; `released()` inside it gives the slot back for a wait."""
        await self.acquire()
        slot = _Slot(self)
        token = _HELD.set(slot)
        try:
            yield
        finally:
            _HELD.reset(token)
            if slot.held:
                self.release()


class _Slot:
    def __init__(self, slots: KeySlots) -> None:
        self.slots = slots
        #: False while given back, and after a cancelled wait to get it again.
        self.held = True


_HELD: ContextVar[_Slot | None] = ContextVar("cts_key_slot", default=None)


@asynccontextmanager
async def released() -> AsyncIterator[None]:
    """Give this key's slot back for the duration (no-op outside `KeySlots.held`).

    Only the key's own task may use it: a task started from a key inherits its context, so a
    shared task (the dialogue) must never call this."""
    slot = _HELD.get()
    if slot is None or not slot.held:
        yield
        return
    slot.held = False
    slot.slots.release()
    cancelled = False
    try:
        yield
    except asyncio.CancelledError:
        # A key being cancelled (the run stops) does not queue for a slot to stop in.
        cancelled = True
        raise
    finally:
        if not cancelled:
            await slot.slots.acquire(resumed=True)
            slot.held = True
