"""A lexical coverage judge: labels each nugget full / partial / none by how much of what the
nugget adds to the user's question the answer states, together, in one place.

Why it exists: the tiny model cannot judge. SmolLM2-135M labels every sample nugget `none`
(κ 0.00 against the people's labels) and the LoRA adapter fine-tuned for the role measured
κ −0.03 (cts/configs/models/smollm2-135m-judge.yaml), so a CPU default judged by it prints zeros
and no test can see a working pipeline from a broken one. Matching a nugget's terms in the
answer is an automatic nugget evaluation with a record of its own (POURPRE, Lin and
Demner-Fushman 2005, scored TREC definition answers by the nugget terms they repeat), needs no
weights and gives the same labels for every order and rerun.

What it cannot do: read meaning. A paraphrase with no shared word, a translated answer, a
wrong unit, or the right value under the wrong entity's name fool it. It is the embedded
default's judge and the end-to-end tests' one; a paper's numbers need an LLM judge measured
with `cts judge calibrate` (docs/calibration-and-rejudging.md).

The rules (docs/calibration-and-rejudging.md, "The lexical judge"):
- a text's *parts*, in order: numbers (NFKC, thousands separators dropped; `7.5` and `7,5` are
  decimals, `5,6,7` lists three numbers, a dotted sequence `3.2.1` is one value stated only as
  written; a number glued to letters that are no unit, `5G`, `A380` or `Q3`, is a term); words of 2+
  letters of any alphabet outside a stop list, cut to their first 5 letters; and runs of
  Chinese, Japanese or Korean script as character pairs;
- **what the question already says is no evidence**: the parts of the fused query (the question
  the user asked, the same in every condition) are taken out of each nugget's, so that an answer
  which restates the question earns nothing it did not find. A nugget left with no part says
  nothing the question does not: `check_nugget` refuses it before a run;
- **a statement has its parts together**: the answer is read in windows of twice the nugget's
  length (at least 16 parts); in the best window, a nugget's *recall* is the share of its terms
  there, and its parts are *bound* when at least half of its neighbouring pairs that the window
  holds stand within 3 parts of each other (word salad holds the words, not the pairs);
- `full`: bound, every number stated (the same value) and recall ≥ 0.5 (a nugget without
  numbers: recall ≥ 0.6); `partial`: bound, some number near (within 15%; a year only as
  itself) with recall ≥ 0.25 (without numbers: recall ≥ 0.3); a nugget whose every number the
  window misses or gets wrong is `none`, however many words it shares; a `full` whose evidence
  offers the value as a guess ("may", "could not confirm", "可能", "未能确认") is `partial`;
- `none` otherwise, and for an empty answer.
The evidence is the answer's sentence sharing most of the nugget's parts."""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: The judge's evidence field allows 120 characters (cts.agents.judge.judge_schema).
EVIDENCE_CHARS = 120
#: How far apart in the answer a part and one of its neighbours may stand for the part to
#: count, and how far apart in the nugget a neighbour stands; the least share of pairs of
#: the parts counted that the answer holds in the nugget's order.
BOUND_DISTANCE = 3
NEIGHBOURS = 2
ORDER_MIN = 0.6

#: Scripts written without spaces between words: Chinese characters (read as jieba's words),
#: and kana and hangul (read as character pairs).
_HAN = r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK = rf"\u3040-\u30ff\uac00-\ud7af{_HAN}"
_HAN_RUN = re.compile(rf"[{_HAN}]+")
_LETTERS = rf"[^\W\d_{_CJK}]"
#: A number, with the letters glued to it (then a unit, or a code: see `parts`).
_TOKEN = re.compile(
    rf"(?P<before>{_LETTERS}*)(?P<number>\d+(?:[.,]\d+)*)(?P<after>{_LETTERS}*)"
    rf"|(?P<word>{_LETTERS}(?:{_LETTERS}|['’-](?={_LETTERS}))+)"
    rf"|(?P<cjk>[{_CJK}]+)"
)
#: Letters glued to a number that still leave it a number (`30km`, `7.5h`, `100mAh`).
_UNITS = frozenset(
    """h hr hrs min s ms km m cm mm kg mg ml l kwh wh mah hz khz mhz ghz kb mb gb tb kw mw gw
    w v x k st nd rd th pm am""".split()
)
#: A sentence ends at . ! ? ; before a space (not the point of 7.5), or at a Chinese stop.
_SENTENCE = re.compile(r"(?<=[.!?;])\s+|(?<=[。！？；])\s*|\n+")
_GUESS = re.compile(
    r"\b(?:may|might|possibly|perhaps|could not (?:confirm|verify)|not sure|unclear)\b"
    r"|可能|也许|未能确认|无法确认|不确定",
    re.I,
)
_STOP = frozenset(
    """the and for with from that this than then there their these those into onto over
    under about after before between during while when where which whose what who whom how
    why are was were been being has have had having does did doing not nor but its it's
    our your they them his her she him you can could would should will shall may might must
    also only just very more most less least such each every some any all both either
    neither other others same per via upon within without out off own too yet still
    again further once here whom because until against above below up down
    is on of to in at by an or as be we he it my no so us do go if me am are vs
    的 了 是 在 和 与 及 或 为 对 于 从 到 被 把 将 由 以 之 其 这 那 也 都 而 并 等 约 每 比
    个 该 此 各 已 所""".split()
)


def normalised(text: str) -> str:
    """NFKC (full-width digits and letters as ASCII), lower case, thousands separators gone."""
    text = unicodedata.normalize("NFKC", text).lower()
    return re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text)  # 3,860吨 too: no \b before 吨


#: A number as the rules compare it: a value, or a dotted sequence kept as written.
Value = float | str
#: One part of a text: a number's value, or a term (a cut word, a character pair, a code).
Part = tuple[str, Value]


def _values(token: str) -> list[Value]:
    """The values one number token states. `7.5` and `7,5` are decimals; with more separators
    it is no decimal: `5,6,7` lists 5, 6 and 7, and a dotted sequence (a version `3.2.1`, a
    date `15.03.2024`, an address `192.168.0.1`) is stated only as itself, never near another
    value, since no single number stands for it."""
    if len(re.findall(r"[.,]", token)) <= 1:
        return [float(token.replace(",", "."))]
    return [part if part.count(".") > 1 else float(part) for part in token.split(",")]


def parts(text: str) -> list[Part]:
    """The text's parts in order (`text` normalised): ("n", value) for numbers, ("t", term)
    for terms."""
    found: list[Part] = []
    for m in _TOKEN.finditer(text):
        if m["number"] is not None:
            before, after = m["before"], m["after"]
            if before in ("", "v") and (after == "" or after in _UNITS):  # 30km, v3.2.1
                found.extend(("n", v) for v in _values(m["number"]))
            else:
                found.append(("t", m[0]))  # 5g, a380, q3: a name, not a quantity
        elif m["word"] is not None:
            word = m["word"]
            if word not in _STOP:
                found.append(("t", word[:5]))
        else:
            found.extend(("t", t) for t in _script_terms(m["cjk"]))
    return found


def _script_terms(run: str) -> list[str]:
    """A run of Chinese, Japanese or Korean script as terms: Chinese characters as jieba's
    words (function words left out: pairs of characters across a word boundary, 量比 of 产量比,
    were terms no rewording keeps), kana and hangul as character pairs (a lone character
    stands for itself)."""
    found: list[str] = []
    at = 0
    for han in [*_HAN_RUN.finditer(run), None]:
        other = run[at : han.start() if han else len(run)]
        if other:
            pairs = [other[i : i + 2] for i in range(len(other) - 1)]
            found += pairs or [other]
        if han is not None:
            found += [w for w in _jieba().lcut(han[0]) if w not in _STOP]
            at = han.end()
    return found


@functools.cache
def _jieba() -> Any:
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    return jieba


def numbers(text: str) -> set[Value]:
    return {v for kind, v in parts(normalised(text)) if kind == "n"}


def terms(text: str) -> set[str]:
    """English (and any alphabet's) content words cut to 5 letters, and character pairs of
    Chinese, Japanese and Korean (a lone character stands for itself)."""
    return {str(v) for kind, v in parts(normalised(text)) if kind == "t"}


def _near(value: Value, among: Iterable[Value], within: float) -> bool:
    """Another value within `within` of `value`; a year (1900–2100) and a dotted sequence
    only as themselves."""
    if isinstance(value, str) or (value.is_integer() and 1900 <= value <= 2100):
        return value in among
    return any(
        abs(other - value) <= within * abs(value) for other in among if isinstance(other, float)
    )


@dataclass(frozen=True)
class Match:
    """How much of one nugget an answer states (counting only parts in their place)."""

    stated: float  # share of the nugget's own numbers stated (1.0 when it has none)
    near: float  # share within 15%
    recall: float  # share of all its terms (the question's words among them)
    has_numbers: bool  # it has numbers of its own
    own_recall: float = 1.0  # share of its own terms (what the question does not say)

    @property
    def label(self) -> str:
        if self.has_numbers:
            if self.stated == 1.0 and self.recall >= 0.5:
                return "full"
            # No value within 15%: the answer states none of its values, or only wrong ones.
            return "partial" if self.near > 0 and self.recall >= 0.25 else "none"
        said = self.own_recall
        return "full" if said >= 0.6 else "partial" if said >= 0.3 else "none"


class UnjudgeableNugget(ValueError):
    """A nugget with no part beyond the question (see `check_nugget`)."""


def own_parts(nugget: str, asked: str = "") -> list[Part]:
    """The nugget's parts, in order, less every part of `asked` (the fused query)."""
    known = set(parts(normalised(asked)))
    return [p for p in parts(normalised(nugget)) if p not in known]


def check_nugget(nugget: str, asked: str = "") -> None:
    """UnjudgeableNugget when the nugget has no part the question does not already have: a
    short answer ("Yes", "No"), or a restatement of the question; no answer could be told to
    state it by its words."""
    if not own_parts(nugget, asked):
        said = "no word or number" if not parts(normalised(nugget)) else "nothing beyond"
        raise UnjudgeableNugget(
            f"{nugget!r}: the lexical judge finds {said} the question"
            + (f" ({asked!r})" if asked and said == "nothing beyond" else "")
            + " in it; reword the nugget with the fact it stands for, or use an LLM judge"
        )


#: Where in the nugget a part's neighbours stand: (part, side: -1 before / +1 after, how far).
Beside = list[tuple[Part, int, int]]


def _neighbours(nugget: Sequence[Part]) -> list[Beside]:
    """Per position of the nugget, the other parts within NEIGHBOURS positions of it."""
    return [
        [
            (nugget[j], 1 if j > k else -1, abs(j - k))
            for j in range(max(0, k - NEIGHBOURS), min(len(nugget), k + NEIGHBOURS + 1))
            if nugget[j] != part
        ]
        for k, part in enumerate(nugget)
    ]


class _Answer:
    """An answer's parts by where they stand, for placing a nugget's parts in it."""

    def __init__(self, answer: Sequence[Part]) -> None:
        self.where: dict[Part, list[int]] = {}
        for i, p in enumerate(answer):
            self.where.setdefault(p, []).append(i)

    def placed(self, at: Iterable[int], beside: Beside) -> list[int]:
        """Of the positions `at`, those where a neighbour stands on its side within
        BOUND_DISTANCE parts; all of them where the answer holds neither next neighbour
        (the wording around the part is another)."""
        if not any(q in self.where for q, _, apart in beside if apart == 1):
            return list(at)
        return [
            i
            for i in at
            if any(
                0 < (j - i) * side <= BOUND_DISTANCE
                for q, side, _ in beside
                for j in self.where.get(q, ())
            )
        ]

    def near(self, value: Value) -> list[int]:
        """Where the answer states a value within 15% of `value`."""
        return [
            i
            for (kind, v), at in self.where.items()
            if kind == "n" and _near(value, [v], 0.15)
            for i in at
        ]


def _in_order(places: list[int]) -> bool:
    """Whether the parts placed (in the nugget's order) stand mostly in that order in the
    answer: at least ORDER_MIN of their pairs (fewer than three parts: always)."""
    pairs = [(a, b) for x, a in enumerate(places) for b in places[x + 1 :] if a != b]
    return len(places) < 3 or not pairs or sum(a < b for a, b in pairs) >= ORDER_MIN * len(pairs)


def _statement(nugget: Sequence[Part], own: set[Part], answer: Sequence[Part]) -> Match:
    """The nugget's parts the answer states in their place: each where one of its neighbours
    in the nugget stands on the same side of it nearby (`_Answer.placed`), and all of them
    mostly in the nugget's order. Word salad holds a nugget's words, rarely in their place."""
    found = _Answer(answer)
    said: set[Part] = set()
    near: set[Value] = set()
    places: list[int] = []
    for part, beside in zip(nugget, _neighbours(nugget), strict=True):
        at = found.placed(found.where.get(part, ()), beside)
        if at:
            said.add(part)
            places.append(min(at, key=lambda i: abs(i - places[-1]) if places else i))
        kind, value = part
        if kind == "n" and part in own and found.placed(found.near(value), beside):
            near.add(value)
    if not _in_order(places):
        said, near = set(), set()
    values = {v for kind, v in own if kind == "n"}
    mine = {p for p in own if p[0] == "t"}
    every = {p for p in nugget if p[0] == "t"}
    share = lambda hits, total: hits / total if total else 1.0  # noqa: E731
    return Match(
        stated=share(sum(("n", v) in said for v in values), len(values)),
        near=share(len(near), len(values)),
        recall=share(len(every & said), len(every)),
        has_numbers=bool(values),
        own_recall=share(len(mine & said), len(mine)),
    )


def match(answer: str, nugget: str, asked: str = "") -> Match:
    """How much of the nugget the answer states, by the rules above."""
    whole = parts(normalised(nugget))
    return _statement(whole, set(own_parts(nugget, asked)), parts(normalised(answer)))


def evidence(answer: str, nugget: str, asked: str = "") -> str:
    """The answer's sentence sharing most of the nugget's own parts ("" if none)."""
    wanted = set(own_parts(nugget, asked))

    def shared(sentence: str) -> int:
        return len(wanted & set(parts(normalised(sentence))))

    sentences = [s.strip() for s in _SENTENCE.split(answer) if s.strip()]
    best = max(sentences, key=shared, default="")
    return best[:EVIDENCE_CHARS] if best and shared(best) else ""


def label(answer: str, nugget: str, asked: str = "") -> tuple[str, str]:
    """(label, evidence) of one nugget against an answer; `asked` is the fused query, whose
    parts are no evidence. UnjudgeableNugget for a nugget `check_nugget` refuses."""
    check_nugget(nugget, asked)
    if not answer.strip():
        return "none", "none"
    verdict = match(answer, nugget, asked).label
    quote = evidence(answer, nugget, asked)
    if verdict == "full" and _GUESS.search(quote):
        verdict = "partial"
    return verdict, quote if verdict != "none" and quote else "none"
