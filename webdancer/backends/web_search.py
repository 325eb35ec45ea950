"""Search backends over HTTP: Serper (paid API), SearXNG (self-hosted), and the
`POST /retrieve` retrieval server that open deep-search projects run over local indexes."""

from __future__ import annotations

import re
from typing import Any

import httpx

from serving.secrets import secret_from_env
from webdancer.search import SearchHit

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def _key(env: str) -> str:
    key = secret_from_env(env)
    if not key:
        raise RuntimeError(f"environment variable {env} is not set")
    return key


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

    def payload(self, query: str, top_k: int) -> dict[str, Any]:
        if _CJK.search(query):
            return {"q": query, "location": "China", "gl": "cn", "hl": "zh-cn", "num": top_k}
        return {"q": query, "location": "United States", "gl": "us", "hl": "en", "num": top_k}

    async def search(self, query: str, top_k: int) -> list[SearchHit]:
        headers = {"X-API-KEY": _key(self.api_key_env), "Content-Type": "application/json"}
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            reply = await client.post(
                self.endpoint, json=self.payload(query, top_k), headers=headers
            )
        reply.raise_for_status()
        return [
            SearchHit(
                title=r.get("title", ""),
                url=r.get("link", ""),
                snippet=r.get("snippet", ""),
                date=r.get("date"),
            )
            for r in reply.json().get("organic", [])[:top_k]
        ]


class SearxngSearch:
    """A self-hosted SearXNG instance's JSON API (`format=json` must be enabled there)."""

    name = "searxng"

    def __init__(self, endpoint: str, timeout_s: float = 30.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout_s = timeout_s

    async def search(self, query: str, top_k: int) -> list[SearchHit]:
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            reply = await client.get(
                f"{self.endpoint}/search", params={"q": query, "format": "json"}
            )
        reply.raise_for_status()
        return [
            SearchHit(
                title=r.get("title", ""),
                url=r.get("url", ""),
                snippet=r.get("content", ""),
                date=r.get("publishedDate"),
            )
            for r in reply.json().get("results", [])[:top_k]
        ]


class RetrievalServerSearch:
    """`POST /retrieve {"queries": [...], "topk": k, "return_scores": true}` → one list of
    `{"document": {"id", "contents"}, "score"}` per query (Search-R1 style local indexes,
    where `contents` is `"title"\\ntext`)."""

    name = "retrieval-server"

    def __init__(self, endpoint: str, timeout_s: float = 60.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout_s = timeout_s

    async def search(self, query: str, top_k: int) -> list[SearchHit]:
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            reply = await client.post(
                f"{self.endpoint}/retrieve",
                json={"queries": [query], "topk": top_k, "return_scores": True},
            )
        reply.raise_for_status()
        hits = []
        for item in reply.json()["result"][0]:
            document = item.get("document", item)
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
