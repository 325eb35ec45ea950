"""Run by tests/reliability/test_crash_safety.py in a subprocess that is killed (SIGKILL) or stopped
(SIGTERM): a small deterministic run (scripted engines) into the run directory given as
argv[1], of shard argv[3] (I/N, or `all`) when given. Signals are handled as `cts run` handles
them; an interrupted run exits 130.

Where it is stopped is set by progress, never by time, so that the tests behave alike on a
fast and a slow machine:
- `--kill-at-call N`: the process SIGKILLs itself as its N-th model call starts (whatever
  else is in flight: other keys' calls, a record being written by the writer thread);
- `--hold-at-records M`: once the run directory holds M records, every model call touches
  `<run_dir>/held` and waits forever: keys are under way and the run cannot finish until it
  is signalled."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

from cts.eval.data.dataset import DatasetSource, corpus_path, load_instances
from cts.eval.experiment import until_signalled
from cts.eval.run.config_sections import ALL_CONDITIONS
from cts.eval.run.pipeline import run_instance
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import Shard
from cts.eval.run.runner import run_keys
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import ChatRequest, ChatResponse
from cts.webdancer.backends.local import LocalSearch
from tests.scripted import scripted_context

CONDITIONS: list[str] = list(ALL_CONDITIONS)
LIMIT = 10


def recorded(run_dir: Path) -> int:
    return sum(len(f.read_text().splitlines()) for f in run_dir.glob("records/*/*.jsonl"))


class Stops:
    """Where this process stops, checked as each model call (over every role) starts."""

    def __init__(self, run_dir: Path, kill_at_call: int | None, hold_at_records: int | None):
        self.run_dir = run_dir
        self.kill_at_call, self.hold_at_records = kill_at_call, hold_at_records
        self.calls = 0

    def wrap(self, engine: ScriptedEngine) -> None:
        complete = engine._complete

        async def _complete(request: ChatRequest) -> ChatResponse:
            self.calls += 1
            if self.calls == self.kill_at_call:
                os.kill(os.getpid(), signal.SIGKILL)
            if self.hold_at_records is not None and recorded(self.run_dir) >= self.hold_at_records:
                (self.run_dir / "held").touch()
                await asyncio.Event().wait()
            return await complete(request)

        engine._complete = _complete  # type: ignore[method-assign]


def main(run_dir: Path, index_dir: Path, shard: Shard, stops: Stops) -> None:
    ctx, roles = scripted_context(LocalSearch(corpus_path("sample"), index_dir))
    for engine in roles.values():
        stops.wrap(engine)
    instances = load_instances(DatasetSource(path="sample", split="dev", limit=LIMIT))
    outcome = asyncio.run(
        until_signalled(
            run_keys(
                instances,
                CONDITIONS,
                [0],
                lambda i, c, s: run_instance(i, c, s, ctx),
                RecordStore(run_dir),
                shard,
                concurrency=3,
            )
        )
    )
    if outcome.interrupted:
        sys.exit(130)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("index_dir", type=Path)
    parser.add_argument("shard", nargs="?", default="all")
    parser.add_argument("--kill-at-call", type=int)
    parser.add_argument("--hold-at-records", type=int)
    args = parser.parse_args()
    main(
        args.run_dir,
        args.index_dir,
        Shard() if args.shard == "all" else Shard.parse(args.shard),
        Stops(args.run_dir, args.kill_at_call, args.hold_at_records),
    )
