"""Search backends, the SSRF guard, HTTP visits (loopback only) and the summarizer prompt."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator

import pytest

from cts.eval.data.dataset import corpus_path
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import Sampling
from cts.webdancer.backends.local import LocalSearch, tokenize
from cts.webdancer.backends.web_search import RetrievalServerSearch, SearxngSearch, SerperSearch
from cts.webdancer.corpus import CorpusDocument
from cts.webdancer.protocol import ToolCall
from cts.webdancer.search import QUERY_SEPARATOR, SearchHit, batched_search, render_hits
from cts.webdancer.ssrf import BlockedURL, check_url
from cts.webdancer.tools import Tools
from cts.webdancer.visit import (
    EVIDENCE_MAX_CHARS,
    SUMMARIZER_SAMPLING,
    SUMMARY_MAX_CHARS,
    HttpPages,
    LocalPages,
    Visitor,
    truncate_tokens,
)
from tests.fault_helpers import QuietHandler, corpus_rows, loopback_server, write_jsonl

# -- rendering -----------------------------------------------------------------------------------


def test_hits_render_in_the_serper_shape_of_the_training_data():
    hits = [
        SearchHit("T1", "https://a.example/1", "snippet one", "May 19, 2025"),
        SearchHit("T2", "https://a.example/2", "snippet two"),
    ]
    assert render_hits("q", hits) == (
        "A Google search for 'q' found 2 results:\n\n## Web Results\n"
        "1. [T1](https://a.example/1)\nDate published: May 19, 2025\n\nsnippet one\n\n"
        "2. [T2](https://a.example/2)\n\nsnippet two"
    )


def test_no_hits_and_video_boilerplate_render_as_in_the_release():
    assert render_hits("q", []) == (
        "No results found for query: 'q'. Use a less specific query."
        "No results found for 'q'. Try with a more general query."
    )
    video = SearchHit("Clip", "https://v.example/1", "Your browser can't play this video. 2 min")
    assert render_hits("q", [video]) == (
        "A Google search for 'q' found 1 results:\n\n## Web Results\n"
        "1. [Clip](https://v.example/1)\n\n 2 min"
    )


class Recorded:
    """A backend that answers every query with one hit and records what it was asked."""

    name = identity = "recorded"

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def search(self, query, top_k):
        self.asked.append(query)
        return [SearchHit(query, f"https://r.example/{len(self.asked)}", "s")]


def test_a_call_searches_its_first_three_queries_as_the_release_unless_configured():
    """The release's MAX_MULTIQUERY_NUM (3) by default, though 18 of the released
    trajectories' 204 search calls show 4-5 result blocks; `max_queries` raises it."""
    call = ToolCall("search", {"query": ["q1", "q2", "q3", "q4", "q5"]})
    for max_queries, shown in ((3, 3), (5, 5)):
        backend = Recorded()
        result = asyncio.run(Tools(backend, visitor=None, max_queries=max_queries).call(call))
        assert backend.asked == ["q1", "q2", "q3", "q4", "q5"][:shown]
        assert len(result.text.split(QUERY_SEPARATOR)) == shown


def test_a_bare_string_query_is_searched_whole():
    """Ours on purpose: the release refuses it (or would search its first 3 characters)."""
    backend = Recorded()
    asyncio.run(Tools(backend, visitor=None).call(ToolCall("search", {"query": "who won it"})))
    assert backend.asked == ["who won it"]


def test_a_failing_query_is_reported_inside_the_response():
    class Flaky:
        name = "flaky"

        async def search(self, query, top_k):
            if query == "bad":
                raise TimeoutError("backend timed out")
            return [SearchHit("T", "https://a.example/", "s")]

    result = asyncio.run(batched_search(Flaky(), ["good", "bad"], 10))
    good, bad = result.text.split(QUERY_SEPARATOR)
    assert good.startswith("A Google search for 'good' found 1 results")
    assert (
        bad
        == "The search for 'bad' failed (TimeoutError: backend timed out). Try again or rephrase."
    )
    assert result.errors == {"bad": "TimeoutError: backend timed out"}


# -- local BM25 ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> LocalSearch:
    return LocalSearch(corpus_path("sample"), tmp_path_factory.mktemp("indexes"))


def test_a_title_finds_its_document_at_rank_1_in_english_and_chinese(local):
    english = [d for d in local.documents if d.language == "en"][::25]
    chinese = [d for d in local.documents if d.language == "zh"][::6]
    assert len(chinese) >= 5
    for doc in english + chinese:
        hits = local.search_sync(doc.title, 10)
        assert hits[0].doc_id == doc.doc_id, (doc.title, [h.doc_id for h in hits[:3]])


def test_chinese_is_segmented_into_words():
    assert tokenize("华岳医学会2023年版成人失眠诊疗共识") == [
        "华岳",
        "医学会",
        "2023",
        "年版",
        "成人",
        "失眠",
        "诊疗",
        "共识",
    ]


def test_top_k_and_no_hits(local):
    assert len(local.search_sync("earbuds battery charging", 10)) == 10
    assert local.search_sync("zzzqqqxxx", 10) == []


def test_the_index_is_reused_when_the_corpus_is_unchanged_and_rebuilt_when_it_changes(tmp_path):
    docs = corpus_rows([f"title {i}" for i in range(5)], [f"alpha beta {i}" for i in range(5)])
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    first = LocalSearch(corpus, tmp_path / "idx")
    again = LocalSearch(corpus, tmp_path / "idx")
    assert first.rebuilt and not again.rebuilt and again.index_dir == first.index_dir
    with corpus.open("a") as f:
        f.write(
            json.dumps(
                {
                    "doc_id": "d9",
                    "url": "https://x.example/9",
                    "title": "gamma",
                    "text": "gamma delta",
                }
            )
            + "\n"
        )
    changed = LocalSearch(corpus, tmp_path / "idx")
    assert changed.rebuilt and changed.index_dir != first.index_dir
    assert changed.search_sync("gamma", 3)[0].doc_id == "d9"
    shutil.rmtree(tmp_path / "idx")


@pytest.mark.parametrize("damage", ["cut", "scribbled", "other corpus"])
def test_a_damaged_index_is_built_again_not_a_traceback(tmp_path, damage):
    """The index under $CTS_HOME/indexes/ is the toolkit's own cache of the corpus: a file of
    it cut short, scribbled over, or saved for another number of documents was a traceback
    at every run's start. It is built again (with a warning), and searches as before."""
    docs = corpus_rows([f"title {i}" for i in range(5)], [f"alpha beta {i}" for i in range(5)])
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    first = LocalSearch(corpus, tmp_path / "idx")
    expected = first.search_sync("alpha 3", 3)
    files = sorted(p for p in first.index_dir.iterdir() if p.name != "cts-index.json")
    if damage == "cut":
        for path in files:
            path.write_bytes(path.read_bytes()[:5])
    elif damage == "scribbled":
        for path in files:
            path.write_bytes(b"\xff" * path.stat().st_size)
    else:
        smaller = write_jsonl(tmp_path / "small.jsonl", docs[:2])
        other = LocalSearch(smaller, tmp_path / "other")
        for path in sorted(other.index_dir.iterdir()):
            if path.name != "cts-index.json":
                shutil.copy(path, first.index_dir / path.name)
    again = LocalSearch(corpus, tmp_path / "idx")
    assert again.rebuilt and again.search_sync("alpha 3", 3) == expected


# -- HTTP search backends against scripted loopback servers --------------------------------------


@pytest.fixture
def http_server() -> Iterator[tuple[str, list, dict]]:
    seen: list[dict] = []
    replies: dict = {}

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            seen.append({"path": self.path, "headers": dict(self.headers)})
            status, body, headers = replies.get(self.path.split("?")[0], (404, {}, None))
            if isinstance(body, str):
                self.send_body(status, body.encode(), headers or {})
            else:
                self._reply(body, status, headers)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "body": body, "headers": dict(self.headers)})
            status, reply, _ = replies.get(self.path, (404, {}, None))
            self._reply(reply, status)

        def _reply(self, body: dict | None, status: int, headers: dict | None = None) -> None:
            data = json.dumps(body).encode() if body is not None else b""
            self.send_body(status, data, headers or None)  # none given, or empty: JSON

    with loopback_server(Handler) as url:
        yield url, seen, replies


def test_serper_request_key_and_chinese_locale(http_server, monkeypatch):
    url, seen, replies = http_server
    replies["/search"] = (
        200,
        {
            "organic": [
                {"title": "T", "link": "https://a.example/", "snippet": "s", "date": "Jan 1, 2025"}
            ]
        },
        None,
    )
    monkeypatch.setenv("SERPER_API_KEY", "secret-key")
    backend = SerperSearch(endpoint=f"{url}/search")
    (hit,) = asyncio.run(backend.search("鹤汀县 春茶", 10))
    assert hit == SearchHit("T", "https://a.example/", "s", "Jan 1, 2025")
    assert seen[0]["body"] == {
        "q": "鹤汀县 春茶",
        "location": "China",
        "gl": "cn",
        "hl": "zh-cn",
        "num": 10,
    }
    assert seen[0]["headers"]["X-API-KEY"] == "secret-key"
    asyncio.run(backend.search("tea harvest", 10))
    assert seen[1]["body"]["gl"] == "us"
    monkeypatch.delenv("SERPER_API_KEY")
    result = asyncio.run(batched_search(backend, ["x"], 10))
    assert "SERPER_API_KEY is not set" in result.text


def test_searxng_and_retrieval_server(http_server):
    url, seen, replies = http_server
    replies["/search"] = (
        200,
        {
            "results": [
                {"title": "S", "url": "https://s.example/", "content": "c", "publishedDate": None}
            ]
        },
        None,
    )
    replies["/retrieve"] = (
        200,
        {"result": [[{"document": {"id": "42", "contents": '"Title"\nbody text'}, "score": 3.2}]]},
        None,
    )
    (hit,) = asyncio.run(SearxngSearch(url).search("q", 10))
    assert hit == SearchHit("S", "https://s.example/", "c", None)
    assert seen[0]["path"] == "/search?q=q&format=json"
    (doc,) = asyncio.run(RetrievalServerSearch(url).search("q", 3))
    assert doc == SearchHit("Title", "doc://42", "body text", None, "42")
    assert seen[1]["body"] == {"queries": ["q"], "topk": 3, "return_scores": True}


# -- SSRF ----------------------------------------------------------------------------------------

REFUSED = [
    "http://localhost/",
    "http://127.0.0.1/",
    "http://127.1.2.3:8080/admin",
    "http://2130706433/",  # decimal 127.0.0.1
    "http://0177.0.0.1/",  # octal
    "http://0x7f.0.0.1/",  # hex
    "http://0/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://10.0.0.5/",
    "http://172.16.3.4/",
    "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data/",  # cloud metadata
    "http://[fe80::1]/",
    "http://[fd00:ec2::254]/",
    "http://100.100.100.200/",  # Alibaba Cloud metadata
    "http://100.64.0.1/",
    "http://0.0.0.0/",
    "file:///etc/passwd",
    "gopher://127.0.0.1/",
]


@pytest.mark.parametrize("url", REFUSED)
def test_ssrf_guard_refuses(url):
    with pytest.raises(BlockedURL):
        check_url(url)


def test_a_public_looking_name_resolving_to_a_private_address_is_refused():
    def resolver(host: str, port: int) -> list[str]:
        return {
            "news.example": ["93.184.216.34"],
            "intranet.example": ["93.184.216.34", "10.1.2.3"],
        }[host]

    check_url("https://news.example/a", resolver=resolver)  # public: allowed
    with pytest.raises(BlockedURL, match=r"'intranet.example' resolves to 10.1.2.3, a private"):
        check_url("https://intranet.example/a", resolver=resolver)
    check_url("http://intranet.example/a", allow_hosts=["intranet.example"], resolver=resolver)


def test_http_visit_extracts_text_and_refuses_a_redirect_to_a_private_address(http_server):
    pytest.importorskip("trafilatura")
    url, seen, replies = http_server
    article = (
        "<html><head><title>Night trains</title></head><body><article><h1>Night "
        "trains</h1>"
        + "<p>The sleeper leaves at 22:10 and arrives at 07:45.</p>" * 8
        + "</article></body></html>"
    )
    replies["/page"] = (200, article, {"Content-Type": "text/html; charset=utf-8"})
    replies["/hop"] = (302, "", {"Location": "/page"})
    replies["/evil"] = (302, "", {"Location": "http://169.254.169.254/latest/meta-data/"})
    replies["/pdf"] = (200, "%PDF", {"Content-Type": "application/pdf"})
    pages = HttpPages(allow_hosts=[url.removeprefix("http://")])  # 127.0.0.1:<port>
    page = asyncio.run(pages.fetch(f"{url}/hop"))
    assert "22:10" in page.text and page.url.endswith("/page")
    with pytest.raises(BlockedURL, match=r"169\.254\.169\.254"):
        asyncio.run(pages.fetch(f"{url}/evil"))
    with pytest.raises(ValueError, match="not a web page"):
        asyncio.run(pages.fetch(f"{url}/pdf"))
    with pytest.raises(BlockedURL, match="loopback"):
        asyncio.run(HttpPages().fetch(f"{url}/page"))  # not allow-listed: loopback refused
    assert [s["path"] for s in seen] == ["/hop", "/page", "/evil", "/pdf"]


# -- the summarizer prompt -----------------------------------------------------------------------


def test_the_summarizer_prompt_is_pinned_byte_for_byte():
    """The response cache keys each summary on this text: a drift in prompts/summarizer.yaml
    (whitespace included) would silently turn every cached visit into a miss. Braces in the
    page and goal stay literal; the page is cut to `max_page_tokens` (a word, or a CJK
    character, each)."""
    page = CorpusDocument(
        doc_id="P-1",
        url="https://pin.example/page",
        title="Aura Pro {specs}",
        text="Battery: 7.5 hours {ANC on}.  Charging 充电 两小时 via USB-C; "
        "the case adds 22 hours more.",
    )
    summarizer = ScriptedEngine(lambda r: json.dumps({"evidence": "e", "summary": "s"}))
    visitor = Visitor(LocalPages([page]), summarizer, Sampling(), max_page_tokens=12)
    asyncio.run(visitor.visit(["https://pin.example/page"], "battery life {in hours}"))
    (request,) = summarizer.requests
    assert [m.role for m in request.messages] == ["user"]
    assert request.messages[0].content == (
        "Read the web page below and extract what serves the user's goal.\n\n"
        "## Web page\nAura Pro {specs}\nBattery: 7.5 hours {ANC on}.  Charging 充电 两小时 via\n\n"
        "## User goal\nbattery life {in hours}\n\n"
        "Return JSON with two fields:\n"
        '- "evidence": the passages of the page that bear on the goal, quoted as closely as '
        "possible;\n"
        '- "summary": a short paragraph saying what the page contributes to the goal (or that '
        "it does\n  not help)."
    )


# -- the summarizer's page and answer --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "max_tokens", "kept"),
    [
        # A Chinese paragraph without spaces: one token a character (was: empty).
        ("北京是中国的首都。" * 100, 800, ("北京是中国的首都。" * 100)[:800]),
        ("北京是中国的首都，上海是最大的城市。", 10, "北京是中国的首都，上"),
        # Mixed: a Latin word is one token, each Chinese character another.
        ("Charging 充电 两小时 via USB-C", 4, "Charging 充电 两"),
        ("USB-C充电。好的", 4, "USB-C充电。"),
        ("ひらがなカタカナ", 3, "ひらが"),
        # English: words, whatever whitespace separates them, kept as it was.
        ("one two\nthree  four five", 3, "one two\nthree"),
        ("one two\n", 2, "one two\n"),
        ("one two\n", 5, "one two\n"),
        ("one two", 0, ""),
    ],
)
def test_a_page_is_cut_to_its_first_tokens_in_any_script(text, max_tokens, kept):
    assert truncate_tokens(text, max_tokens) == kept


def test_a_long_chinese_page_reaches_the_summarizer():
    page = CorpusDocument(
        doc_id="Z-1", url="https://zh.example/p", title="首都", text="北京是中国的首都。" * 100
    )
    summarizer = ScriptedEngine(lambda r: json.dumps({"evidence": "e", "summary": "s"}))
    visitor = Visitor(LocalPages([page]), summarizer, Sampling(), max_page_tokens=800)
    asyncio.run(visitor.visit([page.url], "首都"))
    prompt = summarizer.requests[0].messages[0].content
    assert f"首都\n{page.text[:800]}\n\n## User goal" in prompt


def test_the_longest_notes_the_schema_allows_are_never_cut():
    """A summarizer that writes a token a character (Chinese, for Qwen's tokenizers) and
    stops at max_tokens, as a server does: notes as long as PageNotes allows still come back
    whole, not as the page that "could not be accessed"."""
    longest = json.dumps(
        {"evidence": "证" * EVIDENCE_MAX_CHARS, "summary": "总" * SUMMARY_MAX_CHARS},
        ensure_ascii=False,
    )
    page = CorpusDocument(doc_id="P-1", url="https://p.example/", title="t", text="text")
    summarizer = ScriptedEngine(lambda r: longest[: r.sampling.max_tokens])
    sampling = SUMMARIZER_SAMPLING.apply(Sampling(max_tokens=256))
    result = asyncio.run(Visitor(LocalPages([page]), summarizer, sampling).visit([page.url], "g"))
    assert not result.errors
    assert "证" * EVIDENCE_MAX_CHARS + "\n\nSummary: \n" + "总" * SUMMARY_MAX_CHARS in result.text
