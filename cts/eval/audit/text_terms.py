"""Content terms of a text, for the golden audit's lexical checks: numbers, stemmed words and jieba
words for Chinese, stop words left out; the Jaccard similarity of two texts' terms, a text's
sentences, and the excerpt of it a reviewer reads.

Terms are lowercased words stemmed (a plural, -ed or -ing ending off, then a final e) and cut
to 5 letters, so the same checks work for Chinese text as for English."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache, lru_cache

from cts.webdancer.backends.local import tokenize

#: The excerpt of the cited evidence a reviewer reads per nugget; the stem's length.
EXCERPT_CHARS = 300
STEM_CHARS = 5

_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_THOUSANDS = re.compile(r",(?=\d{3}(?!\d))")
_CJK = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
# A sentence ends at . ! ? ; before a space (not the point of 7.5), or at a CJK stop.
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])\s*|\n+")


@cache
def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_CHINESE, STOPWORDS_EN_PLUS

    return frozenset(STOPWORDS_EN_PLUS) | frozenset(STOPWORDS_CHINESE)


def numbers(text: str) -> set[str]:
    """The numbers in `text`, thousands separators dropped (14,200 and 14200 are one)."""
    return {_THOUSANDS.sub("", n) for n in _NUMBER.findall(text)}


def _stem(word: str) -> str:
    # No stemmer ships with the toolkit: a plural or -ed/-ing ending off, then a 5-letter
    # prefix, is enough for "plays"/"play" and "charging"/"charge" to meet. A final -e goes
    # too: "-es" cannot tell "cases" (case+s) from "boxes" (box+es), and "pricing" has lost
    # it, so "price", "prices", "priced" and "pricing" all become "pric". A final -ss is no
    # plural ("class", "classes" → "class").
    if len(word) > 4 and not word.endswith("ss"):
        for suffix in ("ing", "ed", "es", "s"):
            if word.endswith(suffix) and len(word) - len(suffix) >= 3:
                word = word[: -len(suffix)]
                break
    if word.endswith("e") and len(word) > 3:
        word = word[:-1]
    return word[:STEM_CHARS]


@lru_cache(maxsize=8192)
def terms(text: str) -> frozenset[str]:
    """Content terms: numbers (as `#n`), stemmed words, jieba words of Chinese runs; no stop
    words."""
    found = {f"#{n}" for n in numbers(text)}
    stop = _stopwords()
    for token in tokenize(_NUMBER.sub(" ", text)):
        if token not in stop:
            found.add(token if _CJK.match(token) else _stem(token))
    return frozenset(found)


def similarity(a: str, b: str) -> float:
    """Jaccard similarity of two texts' terms."""
    ta, tb = terms(a), terms(b)
    union = ta | tb
    return len(ta & tb) / len(union) if union else 1.0


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


def excerpt(text: str, queries: Sequence[str], limit: int = EXCERPT_CHARS) -> str:
    """The sentences of `text` that share most terms with any of `queries`, in text order,
    within `limit` characters (the whole text when it fits)."""
    if len(text) <= limit:
        return " ".join(text.split())
    wanted = [terms(q) for q in queries]
    parts = sentences(text)

    def score(i: int) -> tuple[int, int]:
        found = terms(parts[i])
        return (max((len(w & found) for w in wanted), default=0), -i)

    ranked = sorted(range(len(parts)), key=score, reverse=True)
    # Sentences sharing no term with the queries only pad the excerpt out.
    ranked = [i for i in ranked if score(i)[0] > 0] or ranked
    chosen: list[int] = []
    used = 0
    for i in ranked:
        if used + len(parts[i]) + 1 > limit:
            if not chosen:  # one sentence longer than the limit: its start
                return parts[i][: limit - 1] + "…"
            continue
        chosen.append(i)
        used += len(parts[i]) + 1
    return " … ".join(parts[i] for i in sorted(chosen))
