"""The judge's quotes marked in an answer: the answer cut into segments, each with the nuggets
whose quote covers it, matched ignoring case and runs of white space. Apart because matching
is its own algorithm with its own bounds (linear in the answer, at most MAX_QUOTES quotes,
none shorter than MIN_QUOTE_CHARS), tested on its own against the pattern it replaced.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

#: The quotes of at most this many nuggets are marked in the answer (each is looked for once).
MAX_QUOTES = 100
#: A judge's quote shorter than this is not looked for in the answer: it would mark every
#: "e" or "n1" and tell the reader nothing.
MIN_QUOTE_CHARS = 3


class _Lower(dict[int, str]):
    """str.translate's table: each character lower-cased when that is one character ('İ'
    lowers to two, and stays): folded text keeps every position of the original."""

    def __missing__(self, code: int) -> str:
        lower = chr(code).lower()
        self[code] = lower if len(lower) == 1 else chr(code)
        return self[code]


_LOWER = _Lower()
_SPACES = re.compile(r"\s+")


def _folded(text: str) -> tuple[str, list[int], list[int]]:
    """`text` lower-cased with each run of white space made one space, and where each run
    ended in both (folded position, original position), to map a match back. One pass over
    the text and one step per run of white space."""
    lowered = text.translate(_LOWER)
    parts: list[str] = []
    folded_at, original_at = [0], [0]
    last = size = 0
    for run in _SPACES.finditer(lowered):
        parts += [lowered[last : run.start()], " "]
        size += run.start() - last + 1
        last = run.end()
        folded_at.append(size)
        original_at.append(last)
    parts.append(lowered[last:])
    return "".join(parts), folded_at, original_at


def _spans(answer: tuple[str, list[int], list[int]], quote: str) -> list[tuple[int, int]]:
    """Where `quote` occurs in the folded answer (non-overlapping, left to right), as spans
    (first, last character) of the original."""
    folded, folded_at, original_at = answer
    needle = " ".join(quote.split()).translate(_LOWER)

    def original(position: int) -> int:  # a position that is not white space
        run = bisect_right(folded_at, position) - 1
        return original_at[run] + position - folded_at[run]

    spans = []
    at = folded.find(needle)
    while at >= 0:
        last = at + len(needle) - 1
        spans.append((original(at), original(last)))
        at = folded.find(needle, last + 1)
    return spans


def highlight(answer: str, quotes: Mapping[str, str]) -> list[dict[str, Any]]:
    """The answer cut into segments, each with the nuggets whose judge quote covers it
    (matched ignoring case and runs of white space, every occurrence). One pass over the
    answer per quote, and one over the quotes' boundaries: linear in the answer."""
    folded = _folded(answer)
    edges: dict[int, list[tuple[int, str]]] = {}
    for nugget_id, quote in list(quotes.items())[:MAX_QUOTES]:
        if len("".join(quote.split())) < MIN_QUOTE_CHARS:
            continue
        for first, last in _spans(folded, quote):
            edges.setdefault(first, []).append((1, nugget_id))
            edges.setdefault(last + 1, []).append((-1, nugget_id))
    active: dict[str, int] = {}
    ranges: list[tuple[int, int, list[str]]] = []  # (start, end, nuggets), merged as they come
    bounds = sorted({0, len(answer), *edges})
    for start, end in pairwise(bounds):
        for change, nugget_id in edges.get(start, []):
            active[nugget_id] = active.get(nugget_id, 0) + change
            if not active[nugget_id]:
                del active[nugget_id]
        nuggets = sorted(active)
        if ranges and ranges[-1][2] == nuggets:
            ranges[-1] = (ranges[-1][0], end, nuggets)
        else:
            ranges.append((start, end, nuggets))
    return [{"text": answer[start:end], "nuggets": ids} for start, end, ids in ranges]
