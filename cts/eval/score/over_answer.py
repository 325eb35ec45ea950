"""Over-answering: a User Answerer answer that hands the clarifier more of the fused query's missing
information than one attribute (docs/reading-the-report.md). The study's simulator answers "only if
the requested attribute is explicitly present"; a span of the fused query can be most of it.

What is measured, per answer (docs/reading-the-report.md, "Clarification"):

- **Units** are the User Answerer's own: a Latin/digit word (case-folded) or one CJK, kana or
  hangul character (cts/agents/user_answerer.py).
- **Missing information**: the fused query's units that an alignment with the blurred query's
  units leaves unmatched (what blurring removed or changed).
- **Pieces**, the attributes the missing information holds: (1) the instance records a span
  for every removed constraint: each span's units are one piece; (2) it records exactly one
  removed constraint: all missing units are one piece; (3) otherwise (several constraints
  without spans, or none recorded): each run of consecutive missing units, cut at function
  words (the, of, in …; 的, 在, 和 …) and where a number follows a word (`溪川市2025年`), is
  one piece. (3) is a proxy: two constraints written side by side make one piece, one
  constraint cut by a function word or holding a number two.
- A recorded span is found in the fused query as the dataset's check accepted it: in normal
  form (width and case folded: `CALVANNE` is `Calvanne`, `２０２５年` is `2025年`).
- An answer **reveals** a piece when it holds one of the piece's units: by position where the
  answer is a substring of the fused query (of several occurrences, the one that reveals
  fewest), by value otherwise (an abstractive answer): a word the answer has too, never a
  function word, and a CJK character only with a neighbour of it in the fused query (a
  character pair the answer has: 市 alone is in too many words to be a place's).
- An **over-answer** is an answer other than `unknown` that reveals two pieces or more. Where
  (3) finds more runs than the instance records constraints, the surplus runs are presumed to
  be one constraint cut by function words ("the first quarter of 2024"): the answer must
  reveal two pieces more than the surplus. The rate is so a lower bound, never inflated by
  the proxy's cuts.
- Its **share** of the fused query: the fused query's units it holds, over all of them; an
  answer holding more than half of them hands over most of the full intent, whatever it
  reveals (with one removed constraint, the whole fused query reveals one piece).
"""

from __future__ import annotations

import difflib
import functools
import itertools
from dataclasses import asdict, dataclass
from typing import Any, Literal

from cts.agents.types import UNKNOWN
from cts.agents.user_answerer import unit_spans
from cts.eval.data.schema import Instance, normal_form

Basis = Literal["spans", "one_constraint", "runs"]
#: Units that join the pieces of an attribute's wording but carry none of its information.
FUNCTION_WORDS = frozenset(
    "a an the of in on at to for from by with and or as into about than per via vs".split()
    + list("的在和与或及于之了是从")
)
#: An answer holding more than this share of the fused query's units gives most of it away.
MOST = 0.5


@dataclass(frozen=True)
class Reveal:
    """What one answer gives away of one instance's missing information."""

    #: Pieces of the missing information the answer reveals ...
    revealed: int
    #: ... of how many the instance's missing information has, found by `basis` ...
    pieces: int
    basis: Basis
    #: The share of the fused query's units the answer holds.
    share: float
    #: ... and how many it must reveal to over-answer: 2, or 2 more than the runs beyond the
    #: instance's recorded constraints (see the module).
    needed: int = 2

    @property
    def over(self) -> bool:
        return self.revealed >= self.needed

    @property
    def most(self) -> bool:
        return self.share > MOST

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Missing:
    units: tuple[tuple[int, int], ...]  # the fused query's units, as (start, end)
    folded: tuple[str, ...]  # their text, case-folded
    pieces: tuple[frozenset[int], ...]  # unit indices of each piece
    basis: Basis


def _folded(text: str) -> tuple[tuple[tuple[int, int], ...], tuple[str, ...]]:
    spans = tuple(unit_spans(text))
    return spans, tuple(text[a:b].casefold() for a, b in spans)


def _find(text: str, span: str) -> tuple[int, int] | None:
    """Where `span` is in `text`, compared in normal form (cts.eval.data.schema.normal_form, as the
    dataset's check compares them); (start, end) in `text`, or None."""
    folded, starts = "", []
    for at, char in enumerate(text):
        part = normal_form(char) or (" " if char.isspace() else "")
        if part == " " and folded.endswith(" "):
            continue  # a whitespace run is one space
        folded += part
        starts += [at] * len(part)
    wanted = normal_form(span)
    found = folded.find(wanted) if wanted else -1
    if found < 0:
        return None
    last = starts[found + len(wanted) - 1]
    return starts[found], last + 1


def _inside(units: tuple[tuple[int, int], ...], start: int, end: int) -> frozenset[int]:
    """Indices of the units that overlap text[start:end]."""
    return frozenset(i for i, (a, b) in enumerate(units) if a < end and b > start)


def _runs(missing: list[int], folded: tuple[str, ...]) -> tuple[frozenset[int], ...]:
    """Runs of consecutive missing units, cut at function words and where a number follows
    a word (`溪川市2025年`, `Calvanne 2025`: a place, then a year)."""
    runs: list[set[int]] = []
    previous = -2
    for i in missing:
        if folded[i] in FUNCTION_WORDS:
            continue
        number_after_word = i > 0 and folded[i][0].isdigit() and not folded[i - 1][0].isdigit()
        if i != previous + 1 or not runs or number_after_word:
            runs.append(set())
        runs[-1].add(i)
        previous = i
    return tuple(frozenset(r) for r in runs)


@functools.lru_cache(maxsize=4096)  # every answer of an instance, every seed and condition
def _missing(
    blurred_query: str, fused_query: str, types: tuple[str, ...], spans: tuple[str, ...]
) -> _Missing:
    units, folded = _folded(fused_query)
    if spans and all(spans):
        pieces = tuple(
            _inside(units, *where) for span in spans if (where := _find(fused_query, span))
        )
        return _Missing(units, folded, pieces, "spans")
    _, blurred = _folded(blurred_query)
    matcher = difflib.SequenceMatcher(None, blurred, folded, autojunk=False)
    missing = [
        j
        for tag, _, _, j1, j2 in matcher.get_opcodes()
        if tag in ("replace", "insert")
        for j in range(j1, j2)
    ]
    if len(types) == 1:
        one = frozenset(i for i in missing if folded[i] not in FUNCTION_WORDS)
        return _Missing(units, folded, (one,) if one else (), "one_constraint")
    return _Missing(units, folded, _runs(missing, folded), "runs")


def _held(answer: str, fused_query: str, found: _Missing) -> list[frozenset[int]]:
    """The sets of fused-query units the answer may hold: one per occurrence of the answer
    in the fused query; where it is none, the units whose text the answer has."""
    held = []
    at = fused_query.find(answer)
    while at >= 0:
        held.append(_inside(found.units, at, at + len(answer)))
        at = fused_query.find(answer, at + 1)
    if held:
        return held
    said = _folded(answer)[1]
    words = set(said) - FUNCTION_WORDS
    pairs = {a + b for a, b in itertools.pairwise(said)}
    folded = found.folded

    def has(i: int) -> bool:
        unit = folded[i]
        if not _cjk(unit):
            return unit in words
        before = folded[i - 1] + unit if i > 0 and _cjk(folded[i - 1]) else None
        after = unit + folded[i + 1] if i + 1 < len(folded) and _cjk(folded[i + 1]) else None
        return before in pairs or after in pairs

    return [frozenset(i for i in range(len(folded)) if has(i))]


def _cjk(unit: str) -> bool:
    """A one-character unit of Chinese, Japanese or Korean script (cts/agents/user_answerer.py)."""
    return len(unit) == 1 and "\u2e80" <= unit <= "\ud7af"


def reveal(instance: Instance, answer: str) -> Reveal:
    """What `answer` gives away of `instance`'s missing information (see the module)."""
    found = _missing(
        instance.blurred_query,
        instance.fused_query,
        tuple(instance.removed_constraints),
        tuple(instance.removed_spans),
    )
    recorded = len(instance.removed_constraints)
    surplus = len(found.pieces) - recorded if found.basis == "runs" and recorded else 0
    needed = 2 + max(0, surplus)
    if answer == UNKNOWN or not answer.strip():
        return Reveal(0, len(found.pieces), found.basis, 0.0, needed)
    fewest = min(
        _held(answer, instance.fused_query, found),
        key=lambda held: (sum(bool(p & held) for p in found.pieces), len(held)),
    )
    revealed = sum(bool(piece & fewest) for piece in found.pieces)
    share = len(fewest) / len(found.units) if found.units else 0.0
    return Reveal(revealed, len(found.pieces), found.basis, share, needed)
