"""How the User Answerer's answer is matched against a careful person's (cts/eval/audit/
answerer_calibration.py): both normalised and tokenised (a CJK character is a token), containment
as a run of whole tokens, the values a fused query discloses, and which removed spans of other
constraints an answer reveals (the over-disclosure rule in that module's docstring). The labelled
question a rule reads is here too."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from cts.agents.types import UNKNOWN
from cts.agents.user_answerer import unit_spans
from cts.eval.data.schema import normal_form
from cts.eval.score.over_answer import FUNCTION_WORDS

# -- normalising and matching -----------------------------------------------------------------

_CJK_RANGES = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
_TOKEN = re.compile(f"[{_CJK_RANGES}]|[^\\s{_CJK_RANGES}]+")


def tokens(text: str) -> tuple[str, ...]:
    """The normalised tokens of `text`: NFKC, case-folded, punctuation as space; each CJK
    character one token, any other run of non-space characters one token."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    spaced = "".join(" " if unicodedata.category(c).startswith("P") else c for c in folded)
    return tuple(_TOKEN.findall(spaced))


def normalise(text: str) -> str:
    """The tokens joined by single spaces (what exact match compares)."""
    return " ".join(tokens(text))


def _holds(haystack: Sequence[str], needle: Sequence[str]) -> bool:
    n = len(needle)
    return n > 0 and any(
        tuple(haystack[i : i + n]) == tuple(needle) for i in range(len(haystack) - n + 1)
    )


def contains(text: str, part: str) -> bool:
    """Whether normalised `text` holds normalised `part` as a run of whole tokens."""
    return _holds(tokens(text), tokens(part))


def is_unknown(answer: str) -> bool:
    return answer.strip().casefold() == UNKNOWN


# -- disclosure values ------------------------------------------------------------------------

_ALNUM = f"[^\\W_{_CJK_RANGES}]"
# A word: letters/digits with joiners inside (`65-inch`, `250,000`, `men's`, `2:08:51`).
_WORD = re.compile(f"{_ALNUM}+(?:[-.,:'’/+&]{_ALNUM}+)*")
_POSSESSIVE = re.compile(r"['’]s$")
_SENTENCE_END = ".?!。？！"
_OPENERS = "\"'“‘「『《(（[【"
_QUOTED = re.compile(
    r"“([^”]+)”|‘([^’]+)’|「([^」]+)」|『([^』]+)』|《([^》]+)》|\"([^\"]+)\""
    r"|(?<![^\W_])'([^']+)'(?![^\W_])"
)
_CJK_NAME = re.compile(
    f"[{_CJK_RANGES}]{{2}}"
    "(?:医学会|基金会|学院|大学|学会|协会|基金|公司|集团|医院|银行|省|市(?![场民值区])|县|州|镇)"
)


def disclosure_values(fused_query: str) -> list[str]:
    """The numbers, proper nouns, quoted spans and Chinese names of places and bodies in the
    fused query (rules 1-4 of the module's docstring), in order, each once."""
    text = unicodedata.normalize("NFKC", fused_query)
    found: list[str] = []
    for m in _WORD.finditer(text):
        word = _POSSESSIVE.sub("", m.group())  # `Council's` names the council
        before = text[: m.start()].rstrip().rstrip(_OPENERS).rstrip()
        opens_sentence = not before or before[-1] in _SENTENCE_END
        number = any(c.isdigit() for c in word)
        name = any(c.isupper() for c in word) and not opens_sentence and word != "I"
        if number or name:
            found.append(word)
    found += [next(g for g in m.groups() if g) for m in _QUOTED.finditer(text)]
    found += _CJK_NAME.findall(text)
    return [v for v in dict.fromkeys(found) if tokens(v)]


# -- removed spans ----------------------------------------------------------------------------


def _unit_texts(text: str) -> list[str]:
    """The User Answerer's units of `text`, folded as spans are compared (`normal_form`)."""
    folded = normal_form(text)
    return [folded[a:b] for a, b in unit_spans(folded)]


def _occurrences(text: str, part: str) -> list[int]:
    found, at = [], text.find(part)
    while part and at >= 0:
        found.append(at)
        at = text.find(part, at + 1)
    return found


def _held(answer: str, fused: str, units: Sequence[tuple[int, int]]) -> list[frozenset[int]]:
    """The sets of the fused query's units the answer may hold (both folded): one per
    occurrence of the answer in it; where it is none (an abstractive answer), the units whose
    text the answer has."""
    held = [_inside(units, at, at + len(answer)) for at in _occurrences(fused, answer)]
    if held:
        return held
    words = set(_unit_texts(answer))
    return [frozenset(i for i, (a, b) in enumerate(units) if fused[a:b] in words)]


def _inside(units: Sequence[tuple[int, int]], start: int, end: int) -> frozenset[int]:
    """Indices of the units that overlap text[start:end]."""
    return frozenset(i for i, (a, b) in enumerate(units) if a < end and b > start)


def revealed_spans(item: LabelledQuestion, answer: str) -> tuple[str, ...]:
    """The removed spans of constraints the row does not ask about that `answer` reveals
    (the rule in the module's docstring); () for a row that records no span."""
    others = [span for kind, span in item.removed if span and kind != item.constraint_type]
    if not others:
        return ()
    asked = [span for kind, span in item.removed if span and kind == item.constraint_type]
    known_texts = [item.expected, item.question, item.blurred_query or "", *asked]
    # A unit the clarifier already has, or one that carries no information, reveals nothing.
    known = FUNCTION_WORDS | {u for text in known_texts for u in _unit_texts(text)}
    fused = normal_form(item.fused_query)
    units = unit_spans(fused)
    pieces: list[tuple[str, frozenset[int]]] = []
    for span in others:
        folded = normal_form(span)
        # Every occurrence: blurring removed the span's text wherever it stood.
        where = [_inside(units, at, at + len(folded)) for at in _occurrences(fused, folded)]
        telling = {i for found in where for i in found if fused[slice(*units[i])] not in known}
        pieces.append((span, frozenset(telling)))
    fewest = min(
        _held(normal_form(answer), fused, units),
        key=lambda held: sum(bool(piece & held) for _, piece in pieces),
    )
    return tuple(span for span, piece in pieces if piece & fewest)


@dataclass(frozen=True)
class LabelledQuestion:
    id: str
    line: int
    fused_query: str
    question: str
    #: The value a careful person copies from the fused query, or `unknown`.
    expected: str
    language: str
    constraint_type: str
    blurred_query: str | None = None
    note: str | None = None
    #: (type, span) of each removed constraint of the row's instance, when the row records
    #: them; span "" where it gives a type only.
    removed: tuple[tuple[str, str], ...] = ()

    @property
    def expects_value(self) -> bool:
        return self.expected != UNKNOWN
