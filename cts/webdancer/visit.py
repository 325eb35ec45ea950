"""The visit tool: fetch each page (local corpus or HTTP), then the summarizer role extracts what
serves the goal as structured `{evidence, summary}`, rendered as in the WebDancer release."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Protocol
from urllib.parse import urljoin

import httpx
import yaml
from pydantic import BaseModel, Field

from cts.serving.engine import ChatModel
from cts.serving.errors import EngineError
from cts.serving.types import ChatRequest, JsonSchemaOutput, Message, RoleSampling, Sampling
from cts.webdancer.corpus import CorpusDocument
from cts.webdancer.search import QUERY_SEPARATOR
from cts.webdancer.ssrf import BlockedURL, Resolver, allow_entry, check_url, system_resolver
from cts.webdancer.tool_result import ToolResult

# The release's fixed sentences for a page that could not be read (the model saw them).
FALLBACK_EVIDENCE = (
    "The provided webpage content could not be accessed. Please check the URL or file format."
)
FALLBACK_SUMMARY = (
    "The webpage content could not be processed, and therefore, no information is available."
)


def render_visit(url: str, goal: str, evidence: str, summary: str) -> str:
    return (
        f"The useful information in {url} for user goal {goal} as follows: \n\n"
        f"Evidence in page: \n{evidence}\n\nSummary: \n{summary}\n\n"
    )


@dataclass(frozen=True)
class Page:
    url: str
    title: str
    text: str
    doc_id: str | None = None


class PageSource(Protocol):
    name: str
    #: Everything a page it returns depends on besides the URL (the corpus's digest): part of
    #: the tool cache's key for a visit.
    identity: str

    async def fetch(self, url: str) -> Page: ...


class LocalPages:
    """URL → corpus document (also `doc://<doc_id>`, the retrieval server's pseudo-URLs)."""

    name = "local"

    def __init__(
        self, documents: Iterable[CorpusDocument], corpus_digest: str | None = None
    ) -> None:
        """`corpus_digest`: the corpus file's (Corpus.digest); without one, the documents'."""
        self.by_url: dict[str, CorpusDocument] = {}
        content = hashlib.sha256()
        for d in documents:
            self.by_url[d.url] = d
            self.by_url[f"doc://{d.doc_id}"] = d
            if corpus_digest is None:
                content.update(d.model_dump_json().encode() + b"\n")
        self.identity = f"local:corpus-sha256={corpus_digest or content.hexdigest()}"

    async def fetch(self, url: str) -> Page:
        doc = self.by_url.get(url) or self.by_url.get(url.rstrip("/"))
        if doc is None:
            raise LookupError(f"{url} is not in the local corpus")
        return Page(doc.url, doc.title, doc.text, doc.doc_id)


class HttpPages:
    """httpx + trafilatura main-text extraction, with size, time and content-type limits and an
    SSRF guard on the first URL and on every redirect."""

    name = "http"
    #: A page is what its URL serves when fetched; the allow list and the limits decide only
    #: whether a fetch fails, and a failed visit is never cached.
    identity = "http"
    CONTENT_TYPES = ("text/html", "application/xhtml+xml", "text/plain")

    def __init__(
        self,
        allow_hosts: Iterable[str] = (),
        max_bytes: int = 5_000_000,
        timeout_s: float = 20.0,
        max_redirects: int = 5,
        resolver: Resolver = system_resolver,
    ) -> None:
        self.allow_hosts = tuple(allow_hosts)
        for entry in self.allow_hosts:
            allow_entry(entry)  # a malformed entry (`:80`, `a:1:2`) is refused, not ignored
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.max_redirects = max_redirects
        self.resolver = resolver

    async def fetch(self, url: str) -> Page:
        async with httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False) as client:
            for _ in range(self.max_redirects + 1):
                addresses = check_url(url, self.allow_hosts, self.resolver)
                reply = await _send_pinned(client, url, addresses)
                try:
                    if reply.is_redirect:
                        url = urljoin(url, reply.headers.get("location", ""))
                        continue
                    reply.raise_for_status()
                    kind = reply.headers.get("content-type", "").split(";")[0].strip().lower()
                    if kind and kind not in self.CONTENT_TYPES:
                        raise ValueError(f"{url}: content type {kind!r} is not a web page")
                    body = bytearray()
                    async for chunk in reply.aiter_bytes():
                        body += chunk
                        if len(body) > self.max_bytes:
                            raise ValueError(f"{url}: page larger than {self.max_bytes} bytes")
                    html = body.decode(reply.encoding or "utf-8", errors="replace")
                    return _extract(url, html, kind)
                finally:
                    await reply.aclose()
        raise ValueError(f"more than {self.max_redirects} redirects")


async def _send_pinned(client: httpx.AsyncClient, url: str, addresses: list[str]) -> httpx.Response:
    """GET `url` (streamed) from one of its checked `addresses`, in order, never resolving the
    name again: the request goes to the address, with the Host header and, for https, the TLS
    SNI and certificate check still naming the URL's host. No addresses (an allow-listed host):
    an ordinary request by name."""
    original = httpx.URL(url)
    if not addresses:
        return await client.send(client.build_request("GET", original), stream=True)
    host = original.raw_host.decode("ascii")
    extensions = {"sni_hostname": host} if original.scheme == "https" else {}
    for i, address in enumerate(addresses):
        request = client.build_request(
            "GET",
            original.copy_with(host=address.split("%")[0]),
            headers={"Host": original.netloc.decode("ascii")},
            extensions=extensions,
        )
        try:
            return await client.send(request, stream=True)
        except httpx.ConnectError:
            if i == len(addresses) - 1:
                raise
    raise AssertionError("unreachable")


def _extract(url: str, html: str, kind: str) -> Page:
    if kind == "text/plain":
        return Page(url, "", html)
    try:
        import trafilatura
    except ImportError as e:  # the `web` extra
        raise RuntimeError(
            "HTTP visits need trafilatura: pip install 'clarify-then-search[web]'"
        ) from e
    text = trafilatura.extract(html, url=url, include_comments=False) or ""
    metadata = trafilatura.extract_metadata(html)
    if not text.strip():
        raise ValueError(f"{url}: no main text found")
    return Page(url, (metadata.title if metadata else "") or "", text)


#: PageNotes' bounds: they cap a runaway answer, and the summarizer's max_tokens is derived
#: from them so that no answer they allow is cut into invalid JSON.
EVIDENCE_MAX_CHARS = 3000
SUMMARY_MAX_CHARS = 1500
#: The JSON around the two strings (`{"evidence": "", "summary": ""}` is 9-15 tokens) and
#: the odd escaped quote or newline, with room to spare.
NOTES_JSON_OVERHEAD_TOKENS = 64


class PageNotes(BaseModel):
    """What the summarizer role returns for one page."""

    evidence: str = Field(max_length=EVIDENCE_MAX_CHARS)
    summary: str = Field(max_length=SUMMARY_MAX_CHARS)


#: Room for the longest notes PageNotes allows, at the worst case of about one token per
#: character (Chinese for Qwen's tokenizers; English is 3-4 characters a token). The release
#: set no max_tokens, and 12 of the 26 notes in its trajectories are over 512 tokens: a
#: smaller cap cut such notes into invalid JSON, shown to the model as the page that "could
#: not be accessed". (SmolLM2's tokenizer spends ~1.8 tokens on a Chinese character: the tiny
#: model's longest Chinese notes can still be cut.)
SUMMARIZER_SAMPLING = RoleSampling(
    max_tokens=EVIDENCE_MAX_CHARS + SUMMARY_MAX_CHARS + NOTES_JSON_OVERHEAD_TOKENS
)


@cache
def _summarizer_template() -> str:
    text = (
        resources.files("cts.webdancer").joinpath("prompts", "summarizer.yaml").read_text("utf-8")
    )
    template: str = yaml.safe_load(text)["user"]
    return template


def summarizer_prompt(title: str, content: str, goal: str) -> str:
    """The summarizer's one user message (prompts/summarizer.yaml) for a page and a goal."""
    return _summarizer_template().format(title=title, content=content, goal=goal)


#: Scripts written without spaces between words (CJK ideographs and punctuation, kana, Thai,
#: Lao, Tibetan, Myanmar, Khmer): each character counts as a token, as tokenizers roughly
#: see them, where a whitespace "word" would be a whole sentence or paragraph.
_UNSPACED = (
    "\u0e00-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff\u2e80-\u2fdf"
    "\u3000-\u30ff\u31c0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
    "\ufe30-\ufe4f\uff00-\uffef\U00020000-\U0003134f"
)
_PAGE_TOKEN = re.compile(f"[{_UNSPACED}]|[^\\s{_UNSPACED}]+")
#: How `truncate_tokens` counts, in the visit cache's key: visits cached when a run of
#: unspaced text counted as one word (a long Chinese page was read as empty) are not replayed.
PAGE_CUT = "words+unspaced-chars"


def truncate_tokens(text: str, max_tokens: int) -> str:
    """The prefix of `text` holding its first `max_tokens` tokens (a word of a spaced script,
    or one character of an unspaced one), whitespace and line breaks kept as they are, so
    that long pages fit the summarizer's context. Text within the limit comes back whole."""
    if max_tokens <= 0:
        return ""
    for count, token in enumerate(_PAGE_TOKEN.finditer(text), 1):
        if count == max_tokens:
            return text if token.end() == len(text.rstrip()) else text[: token.end()]
    return text


class Visitor:
    def __init__(
        self,
        pages: PageSource,
        summarizer: ChatModel,
        sampling: Sampling,
        max_page_tokens: int = 3000,
    ) -> None:
        self.pages = pages
        self.summarizer = summarizer
        self.sampling = sampling
        self.max_page_tokens = max_page_tokens

    @property
    def identity(self) -> str:
        """What a visit's notes depend on besides the URLs, the goal and the seed: the pages'
        source, the summarizer model, its sampling and prompt, and how much of a page it
        reads. The tool cache keys every visit by it."""
        settings = {
            "sampling": self.sampling.model_dump(mode="json"),
            "max_page_tokens": self.max_page_tokens,
            "page_cut": PAGE_CUT,
            "prompt": hashlib.sha256(_summarizer_template().encode()).hexdigest(),
            "output": JsonSchemaOutput.of(PageNotes).json_schema,
        }
        return f"{self.pages.identity}+{self.summarizer.identity}+" + json.dumps(
            settings, sort_keys=True, separators=(",", ":")
        )

    async def _one(
        self, url: str, goal: str, sampling: Sampling
    ) -> tuple[str, Page | None, str | None]:
        try:
            page = await self.pages.fetch(url)
        # InvalidURL is not an HTTPError: a URL that urlsplit accepts but httpx refuses.
        except (
            BlockedURL,
            LookupError,
            ValueError,
            RuntimeError,
            httpx.HTTPError,
            httpx.InvalidURL,
        ) as e:
            return render_visit(url, goal, FALLBACK_EVIDENCE, FALLBACK_SUMMARY), None, str(e)
        prompt = summarizer_prompt(
            page.title, truncate_tokens(page.text, self.max_page_tokens), goal
        )
        request = ChatRequest(
            messages=(Message(role="user", content=prompt),),
            sampling=sampling,
            output=JsonSchemaOutput.of(PageNotes),
        )
        try:
            notes = PageNotes.model_validate((await self.summarizer.chat(request)).parsed)
        except EngineError as e:
            return (
                render_visit(url, goal, FALLBACK_EVIDENCE, FALLBACK_SUMMARY),
                page,
                f"summarizer: {e}",
            )
        return render_visit(url, goal, notes.evidence, notes.summary), page, None

    async def visit(self, urls: list[str], goal: str, seed: int | None = None) -> ToolResult:
        """The pages' notes as one tool result: its errors are the URLs whose page or notes
        failed, its evidence the pages whose notes the text shows."""
        sampling = self.sampling.with_seed(seed)
        outcomes = await asyncio.gather(*(self._one(u, goal, sampling) for u in urls))
        result = ToolResult(text=QUERY_SEPARATOR.join(t for t, _, _ in outcomes).strip())
        for url, (_, page, error) in zip(urls, outcomes, strict=True):
            result.urls.append(url)
            if page is not None and page.doc_id:
                result.doc_ids.append(page.doc_id)
            if error is not None:
                result.errors[url] = error
            elif page is not None:
                result.evidence.append({"id": page.doc_id or url, "url": url})
        return result
