"""Search backends over HTTP: Serper (paid API), SearXNG (self-hosted), and the
`POST /retrieve` retrieval server that open deep-search projects run over local indexes."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx

from cts.foundation.secrets import secret_from_env
from cts.serving.outputs import valid_unicode
from cts.webdancer.search import SearchHit

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def _key(env: str) -> str:
    key = secret_from_env(env)
    if not key:
        raise RuntimeError(f"environment variable {env} is not set")
    return key


class SearchBackendError(RuntimeError):
    """A search backend's reply that holds no usable results (an HTTP error status, a body that
    is not JSON, or JSON of the wrong shape). `batched_search` shows it to the model as the
    query's failure, never as "no results"."""


async def _fetch_json(method: str, url: str, timeout_s: float, **request: Any) -> Any:
    """One request's JSON body. `timeout_s` bounds the whole exchange (httpx's own timeout is
    per read, so a server trickling bytes could otherwise hold the run); every failure is
    raised with a short message naming the endpoint (the model reads it)."""
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            reply = await asyncio.wait_for(client.request(method, url, **request), timeout_s)
    except (TimeoutError, httpx.TimeoutException) as e:
        raise TimeoutError(f"{url} timed out after {timeout_s:g} s") from e
    if reply.is_error:
        raise SearchBackendError(f"{url} answered HTTP {reply.status_code}")
    try:
        # A lone surrogate escape in a title or snippet would fail the trace's write.
        return valid_unicode(reply.json())
    except (ValueError, RecursionError) as e:
        raise SearchBackendError(
            f"{url} answered HTTP {reply.status_code} with a body that is not JSON"
        ) from e


def _records(value: Any, url: str, where: str) -> list[dict[str, Any]]:
    """`value` as a list of JSON objects, or a SearchBackendError naming what was wrong."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise SearchBackendError(f"{url} answered JSON of the wrong shape ({where})")
    return value


def _field(payload: Any, key: str, url: str, default: Any = None) -> Any:
    if not isinstance(payload, dict) or (key not in payload and default is None):
        raise SearchBackendError(f"{url} answered JSON of the wrong shape (no {key!r} field)")
    return payload.get(key, default)


class SerperSearch:
    """google.serper.dev; the key comes from the environment. Queries with Chinese characters
    use the Chinese locale, as the later WebDancer releases do."""

    name = "serper"
    ENDPOINT = "https://google.serper.dev/search"

    def __init__(
        self,
        endpoint: str = ENDPOINT,
        api_key_env: str = "SERPER_API_KEY",
        timeout_s: float = 30.0,
    ) -> None:
        self.endpoint = endpoint
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        # The locale comes from the query (payload): the endpoint is all else the hits need.
        self.identity = f"serper:{endpoint}"

    def payload(self, query: str, top_k: int) -> dict[str, Any]:
        if _CJK.search(query):
            return {"q": query, "location": "China", "gl": "cn", "hl": "zh-cn", "num": top_k}
        return {"q": query, "location": "United States", "gl": "us", "hl": "en", "num": top_k}

    async def search(self, query: str, top_k: int) -> list[SearchHit]:
        headers = {"X-API-KEY": _key(self.api_key_env), "Content-Type": "application/json"}
        payload = await _fetch_json(
            "POST",
            self.endpoint,
            self.timeout_s,
            json=self.payload(query, top_k),
            headers=headers,
        )
        # Serper leaves `organic` out when nothing was found.
        organic = _field(payload, "organic", self.endpoint, default=[])
        found = _records(organic, self.endpoint, "'organic' is not a list of objects")
        return _hits(found[:top_k], url="link", snippet="snippet", date="date")


def _hits(results: list[dict[str, Any]], *, url: str, snippet: str, date: str) -> list[SearchHit]:
    """Search hits from an API's result objects, given the API's names for a hit's URL,
    snippet and date (a missing one reads as empty)."""
    return [
        SearchHit(
            title=r.get("title", ""),
            url=r.get(url, ""),
            snippet=r.get(snippet, ""),
            date=r.get(date),
        )
        for r in results
    ]


class _SelfHosted:
    """A backend at an endpoint one runs oneself: its identity is its name and the endpoint."""

    name: str

    def __init__(self, endpoint: str, timeout_s: float) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout_s = timeout_s
        self.identity = f"{self.name}:{self.endpoint}"

    async def _fetch(self, method: str, path: str, **request: Any) -> tuple[str, Any]:
        """The URL of `path` under the endpoint, and its JSON body."""
        url = f"{self.endpoint}/{path}"
        return url, await _fetch_json(method, url, self.timeout_s, **request)


class SearxngSearch(_SelfHosted):
    """A self-hosted SearXNG instance's JSON API (`format=json` must be enabled there)."""

    name = "searxng"

    def __init__(self, endpoint: str, timeout_s: float = 30.0) -> None:
        super().__init__(endpoint, timeout_s)

    async def search(self, query: str, top_k: int) -> list[SearchHit]:
        url, payload = await self._fetch("GET", "search", params={"q": query, "format": "json"})
        results = _records(
            _field(payload, "results", url), url, "'results' is not a list of objects"
        )
        return _hits(results[:top_k], url="url", snippet="content", date="publishedDate")


class RetrievalServerSearch(_SelfHosted):
    """`POST /retrieve {"queries": [...], "topk": k, "return_scores": true}` → one list of
    `{"document": {"id", "contents"}, "score"}` per query (Search-R1 style local indexes,
    where `contents` is `"title"\\ntext`)."""

    name = "retrieval-server"

    def __init__(self, endpoint: str, timeout_s: float = 60.0) -> None:
        super().__init__(endpoint, timeout_s)

    async def search(self, query: str, top_k: int) -> list[SearchHit]:
        url, payload = await self._fetch(
            "POST", "retrieve", json={"queries": [query], "topk": top_k, "return_scores": True}
        )
        per_query = _field(payload, "result", url)
        if not isinstance(per_query, list) or len(per_query) != 1:
            raise SearchBackendError(
                f"{url} answered JSON of the wrong shape ('result' is not one list per query)"
            )
        hits = []
        for item in _records(per_query[0], url, "'result' holds items that are not objects"):
            document = item.get("document", item)
            if not isinstance(document, dict):
                raise SearchBackendError(
                    f"{url} answered JSON of the wrong shape ('document' is not an object)"
                )
            title, _, text = str(document.get("contents", "")).partition("\n")
            doc_id = str(document.get("id", ""))
            hits.append(
                SearchHit(
                    title=document.get("title") or title.strip('"'),
                    url=document.get("url") or f"doc://{doc_id}",
                    snippet=(document.get("text") or text).strip()[:300],
                    doc_id=doc_id or None,
                )
            )
        return hits
