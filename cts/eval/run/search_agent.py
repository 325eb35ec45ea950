"""Builds the WebDancer agent an experiment configures: search backend, visit backend with the
summarizer role, tool cache, budgets and sampling."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from cts.eval.data.dataset import corpus_path
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import expand_path
from cts.eval.run.engines import Engines
from cts.webdancer.agent import AgentBudget, WebDancerAgent
from cts.webdancer.backends.local import LocalSearch
from cts.webdancer.backends.web_search import RetrievalServerSearch, SearxngSearch, SerperSearch
from cts.webdancer.corpus import open_corpus
from cts.webdancer.search import SearchBackend
from cts.webdancer.tool_cache import ToolCache
from cts.webdancer.tools import Tools
from cts.webdancer.visit import HttpPages, LocalPages, PageSource, Visitor


def build_search_backend(resolved: ResolvedExperiment) -> SearchBackend:
    search = resolved.experiment.search
    if search.backend == "local":
        return LocalSearch(corpus_path(search.corpus))
    if not search.endpoint and search.backend != "serper":
        raise ValueError(f"search.backend {search.backend!r} needs search.endpoint")
    if search.backend == "serper":
        return SerperSearch(
            endpoint=search.endpoint or SerperSearch.ENDPOINT,
            api_key_env=search.api_key_env or "SERPER_API_KEY",
        )
    if search.backend == "searxng":
        return SearxngSearch(str(search.endpoint))
    return RetrievalServerSearch(str(search.endpoint))


def corpus_digest(resolved: ResolvedExperiment) -> str | None:
    """The digest of the corpus the experiment's tools read (local search or local visits),
    None when they read none. Reading it checks it: a missing or invalid corpus raises
    CorpusError here, before a run writes anything."""
    search = resolved.experiment.search
    if search.backend != "local" and search.visit != "local":
        return None
    return open_corpus(corpus_path(search.corpus)).digest


@asynccontextmanager
async def open_agent(
    resolved: ResolvedExperiment, engines: Engines
) -> AsyncIterator[WebDancerAgent]:
    """The agent, and the tool cache it opened closed when the block ends: the agent is not
    to be used after it (nor after the engines it was given are closed)."""
    agent, cache = _build_agent(resolved, engines)
    try:
        yield agent
    finally:
        cache.close()


def _build_agent(
    resolved: ResolvedExperiment, engines: Engines
) -> tuple[WebDancerAgent, ToolCache]:
    search = resolved.experiment.search
    backend = build_search_backend(resolved)
    pages: PageSource
    if search.visit == "http":
        pages = HttpPages(allow_hosts=search.allow_hosts)
    elif isinstance(backend, LocalSearch):
        pages = LocalPages(backend.documents, backend.corpus_hash)  # already in memory
    else:
        corpus = open_corpus(corpus_path(search.corpus))
        pages = LocalPages(corpus.documents, corpus.digest)
    visitor = Visitor(
        pages,
        engines.roles["summarizer"],
        resolved.sampling_for("summarizer"),
        max_page_tokens=search.max_page_tokens,
    )
    # WebDancer's release sampling (temperature 0.6, top_p 0.95, repetition penalty 1.1) lives
    # in the WebDancer model config; the tiny model keeps its own.
    sampling = resolved.sampling_for("searcher")
    budgets = resolved.experiment.budgets
    # Opened last: a config error above leaves no cache open, nor a new file behind.
    cache = ToolCache(expand_path(search.tool_cache), offline=search.offline)
    tools = Tools(
        backend,
        visitor,
        cache,
        top_k=search.top_k,
        max_queries=search.max_queries,
        purpose=engines.purpose,
    )
    agent = WebDancerAgent(
        engines.roles["searcher"],
        tools,
        sampling,
        AgentBudget(budgets.max_llm_calls, budgets.max_context_tokens),
        constrained=resolved.constrained_search(),
        date=search.date,
    )
    return agent, cache
