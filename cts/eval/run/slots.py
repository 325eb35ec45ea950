"""Key slots: at most `n` evaluation keys at work at once.

A key that waits on work another task does for it (the clarify@k keys of an instance and seed
wait on one shared dialogue, cts/eval/run/dialogue.py) gives its slot back while it waits, so that a
waiting key never keeps a request out of the servers: bench/pipeline.py measured 3 slots held
for 1 request in flight per clarified instance. When the wait ends the key takes the next free
slot before any key that has not started, so that started keys finish (and are recorded) first.
The engines bound the requests each server sees (`max_concurrency`); slots bound the keys whose
state is in memory.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar


class KeySlots:
    """`n` slots. A waiter that held one before goes first (in arrival order); then a new key
    of the group that `rank` puts highest (cts/eval/run/schedule.py: its expected cost, asked when
    the slot frees, so that it follows what the run measures), in arrival order within it."""

    def __init__(self, n: int, rank: Callable[[str], float] | None = None) -> None:
        self._free = n
        self._rank = rank or (lambda group: 0.0)
        #: Waiters that held a slot before, by arrival; a cancelled one stays until popped.
        self._resumed: deque[asyncio.Future[None]] = deque()
        #: New keys by group, each by arrival.
        self._new: dict[str, deque[asyncio.Future[None]]] = {}

    async def acquire(self, resumed: bool = False, group: str = "") -> None:
        if self._free > 0:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._resumed if resumed else self._new.setdefault(group, deque())
        queue.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                # Handed a slot just as it was cancelled: pass the slot on.
                self.release()
            raise

    def release(self) -> None:
        """Hand the slot to the first live waiter, or free it (then no one is waiting)."""
        while self._resumed or any(self._new.values()):
            future = self._resumed.popleft() if self._resumed else self._next_new()
            if not future.done():
                future.set_result(None)
                return
        self._free += 1

    def _next_new(self) -> asyncio.Future[None]:
        waiting = [group for group, queue in self._new.items() if queue]
        return self._new[max(waiting, key=self._rank)].popleft()

    @asynccontextmanager
    async def held(self, group: str = "") -> AsyncIterator[None]:
        """Run a key of `group` in a slot; `released()` inside it gives the slot back for a
        wait."""
        await self.acquire(group=group)
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
