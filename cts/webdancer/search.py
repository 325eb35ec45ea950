"""The search tool: one interface over every backend, results rendered in the Serper text shape
WebDancer was trained on, whatever produced the hits."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class SearchHit:
    title: str
    url: str
    snippet: str = ""
    date: str | None = None
    #: The corpus document behind the hit (local backend), for traces and golden evidence.
    doc_id: str | None = None


class SearchBackend(Protocol):
    name: str
    #: Everything its hits depend on besides the query and top_k (the endpoint, the corpus's
    #: digest): the tool cache keys a search by it, so that another corpus or server never
    #: replays this one's results.
    identity: str

    async def search(self, query: str, top_k: int) -> list[SearchHit]: ...


#: Boilerplate of video results that the release removes from every entry.
VIDEO_BOILERPLATE = "Your browser can't play this video."


def no_results(query: str) -> str:
    """The release's text for a query without hits (Serper leaves `organic` out): its
    exception's message, then its fallback sentence, joined without a space as it joins them."""
    return (
        f"No results found for query: '{query}'. Use a less specific query."
        f"No results found for '{query}'. Try with a more general query."
    )


def render_hits(query: str, hits: list[SearchHit]) -> str:
    """One query's hits as the Serper text the model saw in training."""
    if not hits:
        return no_results(query)
    entries = []
    for i, hit in enumerate(hits, 1):
        date = f"\nDate published: {hit.date}" if hit.date else ""
        snippet = f"\n{hit.snippet}" if hit.snippet else ""
        entry = f"{i}. [{hit.title}]({hit.url}){date}\n{snippet}"
        entries.append(entry.replace(VIDEO_BOILERPLATE, ""))
    return (
        f"A Google search for '{query}' found {len(hits)} results:\n\n## Web Results\n"
        + "\n\n".join(entries)
    )


#: How the release joins the results of several queries made in one call.
QUERY_SEPARATOR = "\n=======\n"


@dataclass
class SearchResult:
    text: str
    hits: dict[str, list[SearchHit]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


async def batched_search(backend: SearchBackend, queries: list[str], top_k: int) -> SearchResult:
    """Run every query; a failing query is reported inside the text, never raised."""

    async def one(query: str) -> tuple[str, list[SearchHit] | None, str | None]:
        try:
            return query, await backend.search(query, top_k), None
        except Exception as e:  # any backend failure becomes text the model can react to
            return query, None, f"{type(e).__name__}: {e}"

    result = SearchResult(text="")
    blocks = []
    for query, hits, error in await asyncio.gather(*(one(q) for q in queries)):
        if error is not None:
            result.errors[query] = error
            blocks.append(f"The search for '{query}' failed ({error}). Try again or rephrase.")
        else:
            assert hits is not None
            result.hits[query] = hits
            blocks.append(render_hits(query, hits))
    result.text = QUERY_SEPARATOR.join(blocks)
    return result
