"""Test builders over the scripted engines (cts/serving/scripted.py): a pipeline context of scripted
roles over a real local search."""

from __future__ import annotations


def scripted_context(search, trace_dir=None, options=None, store=None):  # type: ignore[no-untyped-def]
    """A pipeline context of scripted roles over a real local search; (context, roles).
    `options`: a ClarificationConfig; `store`: a DialogueStore (dialogues kept in memory
    only without one)."""
    from cts.eval.run.dialogue import Clarification
    from cts.eval.run.pipeline import PipelineContext
    from cts.serving.scripted import scripted_roles
    from cts.serving.types import Sampling
    from cts.webdancer.agent import AgentBudget, WebDancerAgent
    from cts.webdancer.tools import Tools
    from cts.webdancer.visit import LocalPages, Visitor

    roles = scripted_roles()
    visitor = Visitor(LocalPages(search.documents), roles["summarizer"], Sampling())
    agent = WebDancerAgent(
        roles["searcher"],
        Tools(search, visitor, top_k=3),
        Sampling(),
        AgentBudget(max_llm_calls=3),
        date="2026-11-30",
    )
    sampling = {role: Sampling(max_tokens=64) for role in roles}
    context = PipelineContext(
        roles=dict(roles),
        agent=agent,
        sampling=sampling,
        clarification=Clarification(dict(roles), sampling, options, k_max=3, store=store),
        trace_dir=trace_dir,
    )
    return context, roles


def dev_instances(n: int = 4):  # type: ignore[no-untyped-def]
    """The first `n` instances of the sample's dev split."""
    from cts.eval.data.dataset import DatasetSource, load_instances

    return load_instances(DatasetSource(path="sample", split="dev", limit=n))
