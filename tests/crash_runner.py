"""Run by tests/test_crash_safety.py in a subprocess that the test kills with SIGKILL: a small
deterministic run (scripted engines with delays) into the run directory given as argv[1]."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from eval.dataset import DatasetSource, corpus_path, load_instances
from eval.pipeline import PipelineContext, run_instance
from eval.runner import RecordStore, run_keys
from serving.types import Sampling
from tests.scripted import scripted_roles
from webdancer.agent import AgentBudget, WebDancerAgent
from webdancer.backends.local import LocalSearch
from webdancer.tools import Tools
from webdancer.visit import LocalPages, Visitor

CONDITIONS = ["blurred", "clarify@1", "clarify@2", "clarify@3", "oracle"]
LIMIT = 10


def main(run_dir: Path, index_dir: Path) -> None:
    roles = scripted_roles()
    for engine in roles.values():
        engine.delay_s = 0.1
    search = LocalSearch(corpus_path("sample"), index_dir)
    visitor = Visitor(LocalPages(search.documents), roles["summarizer"], Sampling())
    agent = WebDancerAgent(
        roles["searcher"],
        Tools(search, visitor, top_k=3),
        Sampling(),
        AgentBudget(max_llm_calls=3),
        date="2026-11-30",
    )
    ctx = PipelineContext(
        roles=dict(roles), agent=agent, sampling={r: Sampling(max_tokens=64) for r in roles}
    )
    instances = load_instances(DatasetSource(path="sample", split="dev", limit=LIMIT))
    asyncio.run(
        run_keys(
            instances,
            CONDITIONS,
            [0],
            lambda i, c, s: run_instance(i, c, s, ctx),
            RecordStore(run_dir),
            concurrency=3,
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
