"""Local search: BM25 (bm25s) over a corpus JSONL, jieba segmentation for Chinese.

The index is built once and saved under $CTS_HOME/indexes/<sha256 of the corpus file>-<index
version>, so an unchanged corpus reloads it and a changed one (new hash) is indexed afresh.
"""

from __future__ import annotations

import fcntl
import json
import logging
import re
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from cts.foundation.files import cts_home
from cts.webdancer.corpus import CorpusDocument, open_corpus
from cts.webdancer.search import SearchHit

#: Part of the index folder name: bump it whenever tokenize() changes, so that no index built
#: with other tokens is reloaded.
INDEX_VERSION = "bm25s-jieba-1"
_CJK_RANGES = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK = re.compile(f"[{_CJK_RANGES}]")
# A CJK run, or a run of other word characters (\w alone would swallow CJK after digits).
_WORD = re.compile(f"[{_CJK_RANGES}]+|[^\\W{_CJK_RANGES}]+")


@cache
def _jieba() -> Any:
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    return jieba


logger = logging.getLogger(__name__)


def tokenize(text: str) -> list[str]:
    """Lowercased words; runs of CJK characters segmented by jieba."""
    tokens: list[str] = []
    for run in _WORD.findall(text.lower()):
        if _CJK.match(run):
            tokens += [t for t in _jieba().lcut(run) if t.strip()]
        else:
            tokens.append(run)
    return tokens


def snippet(text: str, limit: int = 300) -> str:
    """The first sentences of a document, as a search engine's snippet."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit]
    return cut[: cut.rfind(" ")] + " ..." if " " in cut else cut + "..."


class LocalSearch:
    name = "local"

    def __init__(self, corpus_file: Path, index_root: Path | None = None) -> None:
        self.corpus_file = Path(corpus_file)
        corpus = open_corpus(self.corpus_file)
        self.documents: list[CorpusDocument] = list(corpus.documents)
        self.by_url = {d.url: d for d in self.documents}
        self.corpus_hash = corpus.digest
        # Hits depend on the corpus's content and on how it is tokenized and ranked.
        self.identity = f"local:{INDEX_VERSION}:corpus-sha256={self.corpus_hash}"
        self.index_dir = (index_root or cts_home() / "indexes") / (
            f"{self.corpus_hash}-{INDEX_VERSION}"
        )
        self.rebuilt = False
        self._retriever = self._load_or_build()

    def _load(self) -> Any | None:
        """The saved index, or None when there is none or it is damaged (a file cut short or
        scribbled over: it is a cache of the corpus, so it is built again, never a traceback)."""
        import bm25s

        if not (self.index_dir / "cts-index.json").is_file():
            return None
        try:
            retriever = bm25s.BM25.load(str(self.index_dir), show_progress=False)
            if retriever.scores["num_docs"] != len(self.documents):
                raise ValueError("another number of documents than the corpus's")
        except Exception as e:  # bm25s and numpy raise many kinds for a damaged file
            logger.warning("search index %s unreadable (%s): building it again", self.index_dir, e)
            return None
        return retriever

    def _load_or_build(self) -> Any:
        import bm25s

        loaded = self._load()
        if loaded is not None:
            return loaded
        self.index_dir.parent.mkdir(parents=True, exist_ok=True)
        with self.index_dir.with_name(f".{self.index_dir.name}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per corpus across processes
            loaded = self._load()
            if loaded is not None:
                return loaded
            retriever = bm25s.BM25()
            retriever.index(
                [tokenize(f"{d.title} {d.text}") for d in self.documents], show_progress=False
            )
            staging = Path(tempfile.mkdtemp(dir=self.index_dir.parent))
            retriever.save(str(staging), show_progress=False)
            (staging / "cts-index.json").write_text(
                json.dumps(
                    {
                        "corpus": str(self.corpus_file),
                        "sha256": self.corpus_hash,
                        "documents": len(self.documents),
                    }
                )
            )
            shutil.rmtree(self.index_dir, ignore_errors=True)
            staging.replace(self.index_dir)
            self.rebuilt = True
            return retriever

    def search_sync(self, query: str, top_k: int) -> list[SearchHit]:
        tokens = tokenize(query)
        if not tokens:
            return []
        k = min(top_k, len(self.documents))
        indices, scores = self._retriever.retrieve([tokens], k=k, show_progress=False)
        hits = []
        for index, score in zip(indices[0], scores[0], strict=True):
            if score <= 0:
                continue
            doc = self.documents[int(index)]
            hits.append(SearchHit(doc.title, doc.url, snippet(doc.text), doc.date, doc.doc_id))
        return hits

    async def search(self, query: str, top_k: int) -> list[SearchHit]:
        return self.search_sync(query, top_k)
