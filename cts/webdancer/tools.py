"""The agent's two tools behind the tool cache: `search` (batched queries) and `visit`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from cts.webdancer.protocol import BAD_SEARCH, BAD_VISIT, ToolCall
from cts.webdancer.search import SearchBackend, batched_search
from cts.webdancer.tool_cache import ToolCache
from cts.webdancer.tool_result import ToolResult
from cts.webdancer.visit import Visitor


def _strings(value: Any) -> list[str] | None:
    if isinstance(value, str):
        # One URL, as in the release. One query is ours on purpose: the release's search
        # refuses a bare string (qwen_agent checks `query` against the tool's array schema),
        # and its code past that check would slice it to its first three characters.
        value = [value]
    if not isinstance(value, list) or not value:
        return None
    items = [str(v).strip() for v in value if str(v).strip()]
    return list(dict.fromkeys(items)) or None  # a repeated query would only repeat its hits


class Tools:
    def __init__(
        self,
        search: SearchBackend,
        visitor: Visitor,
        cache: ToolCache | None = None,
        top_k: int = 10,
        # The release's MAX_MULTIQUERY_NUM: later queries of a call are dropped unsaid, as
        # there. Its trajectories were made with more (18 of 204 calls show 4-5 result
        # blocks); the experiment's `search.max_queries` sets it.
        max_queries: int = 3,
        purpose: str = "evaluation",
    ) -> None:
        self.search = search
        self.visitor = visitor
        self.cache = cache
        self.top_k = top_k
        self.max_queries = max_queries
        #: Part of a cached visit's key: a visit holds the summarizer's answer, and golden
        #: construction's must not answer an evaluation's. Search results hold no model's
        #: answer and are shared (the same corpus or web answers both).
        self.purpose = purpose

    async def call(self, call: ToolCall, seed: int | None = None) -> ToolResult:
        """Run one tool call; `seed` seeds the visit's summarizer (the search run's seed)."""
        if call.name == "search":
            queries = _strings(call.arguments.get("query", call.arguments.get("queries")))
            if queries is None:
                return ToolResult(BAD_SEARCH)
            return await self._cached(
                "search",
                self.search.identity,
                {"query": queries[: self.max_queries], "top_k": self.top_k},
                self._search,
            )
        urls = _strings(call.arguments.get("url"))
        goal = call.arguments.get("goal")
        if urls is None or not isinstance(goal, str) or not goal.strip():
            return ToolResult(BAD_VISIT)
        backend = self.visitor.identity
        arguments: dict[str, Any] = {"url": urls, "goal": goal.strip(), "purpose": self.purpose}
        summarizer_seed = self.visitor.sampling.with_seed(seed).seed
        if summarizer_seed != self.visitor.sampling.seed:
            # A sampling summarizer's notes depend on the seed: one cached visit per seed.
            arguments["seed"] = summarizer_seed
        return await self._cached("visit", backend, arguments, self._visit)

    async def _search(self, arguments: dict[str, Any]) -> ToolResult:
        found = await batched_search(self.search, arguments["query"], arguments["top_k"])
        hits = [h for query_hits in found.hits.values() for h in query_hits]
        return ToolResult(
            found.text,
            [h.doc_id for h in hits if h.doc_id],
            [h.url for h in hits],
            found.errors,
            [{"id": h.doc_id or h.url, "url": h.url} for h in hits],
        )

    async def _visit(self, arguments: dict[str, Any]) -> ToolResult:
        return await self.visitor.visit(arguments["url"], arguments["goal"], arguments.get("seed"))

    async def _cached(
        self,
        tool: str,
        backend: str,
        arguments: dict[str, Any],
        run: Callable[[dict[str, Any]], Awaitable[ToolResult]],
    ) -> ToolResult:
        if self.cache is not None:
            stored = self.cache.get(tool, backend, arguments, ToolResult.stored)
            if stored is not None:
                return stored
        result: ToolResult = await run(arguments)
        # Failures may be passing (a timeout); only clean results are replayed.
        if self.cache is not None and not result.errors:
            self.cache.put(tool, backend, arguments, result.as_dict())
        return result
