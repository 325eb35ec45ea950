"""The tool cache is bound to what a tool's result depends on: a search to its backend's
endpoint or corpus and its top_k, a visit to the pages' corpus and to the summarizer's model,
sampling, prompt and page cut. Two corpora that differ in one document never share a cached
result, and a run directory made on one corpus refuses to resume on the other."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

from cts.eval.data.dataset import corpus_path
from cts.foundation.files import sha256_file
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import Sampling
from cts.webdancer.backends.local import LocalSearch
from cts.webdancer.backends.web_search import SearxngSearch
from cts.webdancer.protocol import ToolCall
from cts.webdancer.tool_cache import ToolCache, ToolCacheMiss
from cts.webdancer.tools import Tools
from cts.webdancer.visit import LocalPages, Visitor
from tests.fault_helpers import QuietHandler, corpus_rows, loopback_server, write_jsonl
from tests.scripted_cts import cts

DOCS = corpus_rows(
    [f"Rail pass {i}" for i in range(5)],
    [f"The monthly rail pass of line {i} costs {10 + i} euros." for i in range(5)],
)


def _corpus(path: Path, edited: bool = False) -> Path:
    """DOCS, or DOCS with one document's text changed."""
    docs = [dict(d) for d in DOCS]
    if edited:
        docs[2]["text"] = "The monthly rail pass of line 2 costs 99 euros since May."
    return write_jsonl(path, docs)


def _echoing_summarizer() -> ScriptedEngine:
    """Notes that quote the page it was shown, so that a visit's result shows its page."""

    def notes(request):  # type: ignore[no-untyped-def]
        page = request.messages[0].content.split("## Web page\n", 1)[1].split("\n\n")[0]
        return json.dumps({"evidence": page, "summary": "s"})

    return ScriptedEngine(notes)


def _tools(corpus: Path, cache: ToolCache, tmp_path: Path, **visit: object) -> Tools:
    search = LocalSearch(corpus, tmp_path / "indexes")
    visitor = Visitor(
        LocalPages(search.documents, search.corpus_hash),
        visit.get("summarizer") or _echoing_summarizer(),  # type: ignore[arg-type]
        visit.get("sampling") or Sampling(),  # type: ignore[arg-type]
        max_page_tokens=visit.get("max_page_tokens") or 3000,  # type: ignore[arg-type]
    )
    return Tools(search, visitor, cache, top_k=int(visit.get("top_k") or 5))  # type: ignore[call-overload]


SEARCH = ToolCall("search", {"query": ["monthly rail pass line 2"]})
VISIT = ToolCall("visit", {"url": ["https://x.example/2"], "goal": "the price"})


def test_two_corpora_differing_in_one_document_share_no_cached_search_or_visit(tmp_path):
    cache = ToolCache(tmp_path / "tools.sqlite")
    before = _tools(_corpus(tmp_path / "a.jsonl"), cache, tmp_path)
    after = _tools(_corpus(tmp_path / "b.jsonl", edited=True), cache, tmp_path)
    for call in (SEARCH, VISIT):
        first = asyncio.run(before.call(call))
        again = asyncio.run(before.call(call))
        assert "12 euros" in first.text and again.cached and again.text == first.text
        edited = asyncio.run(after.call(call))
        assert not edited.cached, f"a {call.name} replayed the other corpus's result"
        assert "99 euros" in edited.text and "12 euros" not in edited.text
    # The same corpus read from another path is the same corpus: its results are replayed.
    same = _tools(_corpus(tmp_path / "a-copy.jsonl"), cache, tmp_path)
    assert all(asyncio.run(same.call(c)).cached for c in (SEARCH, VISIT))
    cache.close()


def test_a_visit_is_keyed_by_the_summarizer_and_the_page_cut(tmp_path):
    """Each setting the notes depend on, changed alone, is a miss (the summarizer asked)."""
    cache = ToolCache(tmp_path / "tools.sqlite")
    corpus = _corpus(tmp_path / "a.jsonl")
    assert not asyncio.run(_tools(corpus, cache, tmp_path).call(VISIT)).cached
    changed: dict[str, dict[str, object]] = {
        "max_page_tokens": {"max_page_tokens": 100},
        "sampling": {"sampling": Sampling(max_tokens=300)},
        "greedy_to_sampled": {"sampling": Sampling(temperature=0.7)},
        "summarizer model": {"summarizer": ScriptedEngine(lambda r: "{}", name="other")},
    }
    for what, setting in changed.items():
        summarizer = setting.get("summarizer") or _echoing_summarizer()
        tools = _tools(corpus, cache, tmp_path, **{**setting, "summarizer": summarizer})
        result = asyncio.run(tools.call(VISIT))
        assert not result.cached and summarizer.requests, what  # type: ignore[union-attr]
    cache.close()


def test_a_search_is_keyed_by_top_k(tmp_path):
    cache = ToolCache(tmp_path / "tools.sqlite")
    corpus = _corpus(tmp_path / "a.jsonl")
    assert not asyncio.run(_tools(corpus, cache, tmp_path, top_k=5).call(SEARCH)).cached
    fewer = asyncio.run(_tools(corpus, cache, tmp_path, top_k=1).call(SEARCH))
    assert not fewer.cached and fewer.text.count("](https://x.example/") == 1
    cache.close()


@pytest.fixture
def two_searxng() -> Iterator[list[str]]:
    """Two SearXNG stand-ins on loopback, each answering one hit of its own."""
    with ExitStack() as servers:
        urls = []
        for name in ("first", "second"):

            class Handler(QuietHandler):
                title = name

                def do_GET(self) -> None:
                    hit = {"title": self.title, "url": f"https://{self.title}.example/"}
                    self.send_json(200, {"results": [{**hit, "content": ""}]})

            urls.append(servers.enter_context(loopback_server(Handler)))
        yield urls


def test_a_web_search_is_keyed_by_its_endpoint(two_searxng, tmp_path):
    cache = ToolCache(tmp_path / "tools.sqlite")
    visitor = Visitor(LocalPages([]), _echoing_summarizer(), Sampling())
    results = [
        asyncio.run(Tools(SearxngSearch(url), visitor, cache, top_k=3).call(SEARCH))
        for url in two_searxng
    ]
    assert [r.cached for r in results] == [False, False]
    assert "[first]" in results[0].text and "[second]" in results[1].text
    cache.close()


# -- whole runs ----------------------------------------------------------------------------------


def _sample_corpus(path: Path) -> Path:
    path.write_bytes(corpus_path("sample").read_bytes())
    return path


def _edit_document(corpus: Path, doc_id: str) -> None:
    """One document's title changed, the rest of the corpus byte for byte the same."""
    lines = corpus.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        doc = json.loads(line)
        if doc["doc_id"] == doc_id:
            doc["title"] = "EDITED TITLE"
            lines[i] = json.dumps(doc, ensure_ascii=False) + "\n"
    corpus.write_text("".join(lines))


def _run_args(run_dir: Path, corpus: Path, responses: Path, tools: Path) -> list[str]:
    return [
        "run",
        "--output-dir",
        str(run_dir),
        "--limit",
        "2",
        "--set",
        "conditions=[blurred]",
        "--set",
        f"search.corpus={corpus}",
        "--set",
        f"cache.path={responses}",
        "--set",
        f"search.tool_cache={tools}",
        "--set",
        "search.date=2026-11-30",
    ]


def _tool_steps(run_dir: Path) -> list[dict]:
    return [
        step
        for trace in sorted((run_dir / "traces").rglob("*.json"))
        for step in json.loads(trace.read_text())["steps"]
        if step["kind"] == "tool"
    ]


def test_a_run_on_an_edited_corpus_replays_no_search_and_a_resume_on_it_is_refused(tmp_path):
    """The probe's case: a new run, in a fresh run directory with a fresh response cache but
    the shared tool cache, on a corpus edited in one document, got the old corpus's results
    (every tool step `cached`). And the old run directory, resumed on the edited corpus,
    would have mixed records of both."""
    home, tools = tmp_path / "home", tmp_path / "tools.sqlite"
    corpus = _sample_corpus(tmp_path / "corpus.jsonl")
    first = cts(_run_args(tmp_path / "a", corpus, tmp_path / "a.sqlite", tools), home)
    assert first.returncode == 0, first.stderr[-3000:]
    steps = _tool_steps(tmp_path / "a")
    assert steps and not any(s["cached"] for s in steps)
    _edit_document(corpus, steps[0]["doc_ids"][0])

    second = cts(_run_args(tmp_path / "b", corpus, tmp_path / "b.sqlite", tools), home)
    assert second.returncode == 0, second.stderr[-3000:]
    replayed = _tool_steps(tmp_path / "b")
    assert len(replayed) == len(steps) and not any(s["cached"] for s in replayed)
    assert "EDITED TITLE" in replayed[0]["result"]

    config = (tmp_path / "a" / "config.yaml").read_bytes()
    resumed = cts(_run_args(tmp_path / "a", corpus, tmp_path / "a.sqlite", tools), home)
    assert resumed.returncode == 2, resumed.stdout + resumed.stderr
    assert "fingerprint.corpus" in resumed.stderr and "resuming would mix" in resumed.stderr
    assert (tmp_path / "a" / "config.yaml").read_bytes() == config
    digest = yaml.safe_load(config)["fingerprint"]["corpus"]
    assert digest != sha256_file(corpus)


# -- a corrupt row ------------------------------------------------------------------------------

CORRUPT_ROWS = {
    "not JSON": "{not json",
    "cut short": '{"text": "A Google search for',
    "not an object": "[1, 2]",
    "wrong types": '{"text": 1, "doc_ids": [], "urls": [], "errors": {}, "evidence": []}',
    "unknown field": '{"text": "t", "doc_ids": [], "urls": [], "errors": {}, "evidence": [],'
    ' "x": 1}',
    "no evidence (an older version's row)": '{"text": "t", "doc_ids": [], "urls": [], '
    '"errors": {}}',
    "nested deep": "[" * 5000 + "]" * 5000,
}


@pytest.mark.parametrize("row", list(CORRUPT_ROWS))
def test_a_corrupt_tool_cache_row_is_a_counted_miss_and_is_replaced(tmp_path, row):
    import sqlite3

    path = tmp_path / "tools.sqlite"
    corpus = _corpus(tmp_path / "a.jsonl")
    first = ToolCache(path)
    assert not asyncio.run(_tools(corpus, first, tmp_path).call(SEARCH)).cached
    first.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE tool_calls SET result = ?", (CORRUPT_ROWS[row],))
    cache = ToolCache(path)
    tools = _tools(corpus, cache, tmp_path)
    again = asyncio.run(tools.call(SEARCH))
    assert not again.cached and "12 euros" in again.text
    assert cache.stats() == {"hits": 0, "misses": 1, "invalid": 1}
    assert asyncio.run(tools.call(SEARCH)).cached  # the fresh result replaced the row
    assert cache.stats() == {"hits": 1, "misses": 1, "invalid": 1}
    cache.close()
    offline = ToolCache(path, offline=True)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE tool_calls SET result = ?", (CORRUPT_ROWS[row],))
    with pytest.raises(ToolCacheMiss, match="its row was not a result, and was removed"):
        asyncio.run(_tools(corpus, offline, tmp_path).call(SEARCH))
    offline.close()


def test_a_run_over_corrupt_tool_cache_rows_records_no_failure_and_counts_them(tmp_path):
    import sqlite3

    home, tools = tmp_path / "home", tmp_path / "tools.sqlite"
    corpus = _sample_corpus(tmp_path / "corpus.jsonl")
    first = cts(_run_args(tmp_path / "a", corpus, tmp_path / "a.sqlite", tools), home)
    assert first.returncode == 0, first.stderr[-3000:]
    with sqlite3.connect(tools) as db:
        rows = db.execute("UPDATE tool_calls SET result = 'garbage'").rowcount
    second = cts(_run_args(tmp_path / "b", corpus, tmp_path / "b.sqlite", tools), home)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "0 failed;" in second.stdout
    assert f"tool cache 0 hits, {rows} misses, {rows} invalid" in second.stdout
