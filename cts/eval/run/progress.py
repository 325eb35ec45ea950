"""How a run shows its progress over its keys: a progress bar at a terminal, plain lines in a
log (a CI log, an sbatch output file), where a bar cannot redraw and rich prints nothing until
the run ends.

A line reads `quickstart: 7/15 done (2 already), 1 failed, 2.1 keys/min, ETA 4 min`: one when
the keys start, then at most one every `every_s` seconds (also while no key finishes, so that a
slow model still shows the job is alive), and one at the end. The lines go through a callback:
the command decides where they are printed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import TypeAlias

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from cts.eval.data.schema import Record


@dataclass(frozen=True)
class ProgressLog:
    """Progress as lines, each given to `emit`, at most one every `every_s` seconds between
    the first and the last (0: one per finished key)."""

    emit: Callable[[str], None]
    every_s: float = 30.0
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)


#: True: a progress bar; False: nothing; a ProgressLog: lines.
ShowProgress: TypeAlias = bool | ProgressLog


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class ProgressLines:
    """The counts behind the lines: keys done (those already recorded included), failed (of
    this run's), and the rate of this run's keys, from which the ETA of the rest follows."""

    def __init__(
        self, name: str, total: int, already: int, log: ProgressLog, unit: str = "keys"
    ) -> None:
        self.name = name
        self.unit = unit
        self.total = total
        self.already = already
        self.ran = 0
        self.failed = 0
        self.log = log
        self.started = log.clock()
        self.last_emitted: float | None = None

    def line(self, final: bool = False) -> str:
        elapsed = self.log.clock() - self.started
        per_min = self.ran / (elapsed / 60) if elapsed > 0 else 0.0
        left = self.total - self.already - self.ran
        if final:
            tail = f"{_duration(elapsed)} elapsed"
        elif left <= 0:
            tail = "finishing"
        elif self.ran == 0 or elapsed <= 0:
            # No rate to go by yet; the time says the job is alive (a first key can take long).
            tail = f"ETA ?, no {self.unit.removesuffix('s')} finished in {_duration(elapsed)}"
        else:
            tail = f"ETA {_duration(left / per_min * 60)}"
        return (
            f"{self.name}: {self.already + self.ran}/{self.total} done ({self.already} already), "
            f"{self.failed} failed, {per_min:.1f} {self.unit}/min, {tail}"
        )

    def emit(self, final: bool = False) -> None:
        self.last_emitted = self.log.clock()
        self.log.emit(self.line(final))

    def due_in(self) -> float:
        """Seconds until the next line may be printed."""
        if self.last_emitted is None:
            return 0.0
        return self.last_emitted + self.log.every_s - self.log.clock()

    def advance(self, failed: bool = False) -> None:
        self.ran += 1
        self.failed += failed
        if self.due_in() <= 0:
            self.emit()

    async def tick(self) -> None:
        """Print a line whenever one is due, keys finishing or not (runs until cancelled)."""
        while True:
            await asyncio.sleep(max(self.due_in(), 0.01))
            if self.due_in() <= 0:
                self.emit()


@asynccontextmanager
async def key_progress(
    name: str, total: int, already: int, show: ShowProgress
) -> AsyncIterator[Callable[[Record], None]]:
    """For the block, a function to call with each record a key finishes with; the progress is
    shown as `show` says (`already`: keys recorded before, counted as done)."""
    async with progress(name, total, already, show) as advance:
        yield lambda record: advance(record.error is not None)


@asynccontextmanager
async def progress(
    name: str, total: int, already: int, show: ShowProgress, unit: str = "keys"
) -> AsyncIterator[Callable[[bool], None]]:
    """For the block, a function to call each time one of `total` things is done (True: it
    failed); shown as `show` says."""
    if isinstance(show, ProgressLog):
        lines = ProgressLines(name, total, already, show, unit)
        lines.emit()
        ticker = asyncio.create_task(lines.tick()) if show.every_s > 0 else None
        try:
            yield lines.advance
        finally:
            if ticker is not None:
                ticker.cancel()
                with suppress(asyncio.CancelledError):
                    await ticker
            lines.emit(final=True)
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}"),
        TimeRemainingColumn(),
        disable=not show,
    ) as bars:
        bar = bars.add_task(name, total=total, completed=already, failed=0)
        failed = 0

        def done(failed_one: bool = False) -> None:
            nonlocal failed
            failed += failed_one
            bars.update(bar, advance=1, failed=failed)

        yield done
