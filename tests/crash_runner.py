"""Run by tests/test_crash_safety.py in a subprocess that the test kills (SIGKILL) or stops
(SIGTERM): a small deterministic run (scripted engines with delays) into the run directory given
as argv[1], of shard argv[3] (I/N) when given. Signals are handled as `cts run` handles them;
an interrupted run exits 130."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from eval.config import ALL_CONDITIONS
from eval.dataset import DatasetSource, corpus_path, load_instances
from eval.pipeline import run_instance
from eval.run import until_signalled
from eval.runner import RecordStore, Shard, run_keys
from tests.scripted import scripted_context
from webdancer.backends.local import LocalSearch

CONDITIONS: list[str] = list(ALL_CONDITIONS)
LIMIT = 10


def main(run_dir: Path, index_dir: Path, shard: Shard) -> None:
    ctx, roles = scripted_context(LocalSearch(corpus_path("sample"), index_dir))
    for engine in roles.values():
        engine.delay_s = 0.1
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
    main(
        Path(sys.argv[1]), Path(sys.argv[2]), Shard.parse(sys.argv[3]) if sys.argv[3:] else Shard()
    )
