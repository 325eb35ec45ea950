"""Test builders over the scripted engines (serving/scripted.py): a pipeline context of scripted
roles over a real local search."""

from __future__ import annotations


def scripted_context(search, trace_dir=None, options=None, store=None):  # type: ignore[no-untyped-def]
    """A pipeline context of scripted roles over a real local search; (context, roles).
    `options`: a ClarificationConfig; `store`: a DialogueStore (dialogues kept in memory
    only without one)."""
    from eval.run.dialogue import Clarification
    from eval.run.pipeline import PipelineContext
    from serving.scripted import scripted_roles
    from serving.types import Sampling
    from webdancer.agent import AgentBudget, WebDancerAgent
    from webdancer.tools import Tools
    from webdancer.visit import LocalPages, Visitor

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
