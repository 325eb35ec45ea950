"""A lexical coverage judge: labels each nugget full / partial / none by how much of it the
answer repeats — its numbers, and its content words (or, in Chinese, its character pairs).

Why it exists: the tiny model cannot judge. SmolLM2-135M labels every sample nugget `none`
(κ 0.00 against the people's labels) and the LoRA adapter fine-tuned for the role measured
κ −0.03 (configs/models/smollm2-135m-judge.yaml), so a CPU default judged by it prints zeros
and no test can see a working pipeline from a broken one. Matching a nugget's terms in the
answer is an automatic nugget evaluation with a record of its own (POURPRE, Lin and
Demner-Fushman 2005, scored TREC definition answers by the nugget terms they repeat), needs no
weights and gives the same labels for every order and rerun.

What it cannot do: read meaning. A paraphrase with no shared word, a translated answer, a
wrong unit, or the right value under the wrong entity's name fool it. It is the embedded
default's judge and the end-to-end tests' one; a paper's numbers need an LLM judge measured
with `cts judge calibrate` (docs/calibration-and-rejudging.md).

The rules, fixed before any measurement on the people's labels (they follow the sample
labels' own rules: a nugget's parts are its values and its conditions):
- numbers (NFKC, thousands separators dropped): *stated* when the answer has the same value,
  *near* when it has one within 15% (a year only as itself); `7.5` and `7,5` are decimals,
  `5,6,7` lists three numbers, and a dotted sequence (`3.2.1`, `15.03.2024`, `192.168.0.1`)
  is one value stated only as written;
- terms: English words of 3+ letters outside a stop list, cut to their first 5 letters (a
  crude stem: charge / charging / charged); Chinese character pairs; a nugget's *recall* is
  the share of its terms in the answer;
- `full`: every number stated and recall ≥ 0.5 (a nugget without numbers: recall ≥ 0.6);
- `partial`: some number near with recall ≥ 0.25 (without numbers: recall ≥ 0.3); a nugget
  whose every number the answer misses or gets wrong is `none`, however many words it shares;
  a `full` whose best sentence offers the value as a guess ("may", "could not confirm",
  "可能", "未能确认") is `partial`;
- `none` otherwise, and for an empty answer.
The evidence is the answer's sentence sharing most of the nugget's terms and numbers."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

#: The judge's evidence field allows 120 characters (agents.judge.judge_schema).
EVIDENCE_CHARS = 120

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_WORD = re.compile(r"[a-z][a-z'’-]{2,}")
_CJK_RUN = re.compile(r"[\u4e00-\u9fff]+")
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
    again further once here whom because until against above below up down""".split()
)


def normalised(text: str) -> str:
    """NFKC (full-width digits and letters as ASCII), lower case, thousands separators gone."""
    text = unicodedata.normalize("NFKC", text).lower()
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)


#: A number as the rules compare it: a value, or a dotted sequence kept as written.
Value = float | str


def _values(token: str) -> list[Value]:
    """The values one number token states. `7.5` and `7,5` are decimals; with more separators
    it is no decimal: `5,6,7` lists 5, 6 and 7, and a dotted sequence (a version `3.2.1`, a
    date `15.03.2024`, an address `192.168.0.1`) is stated only as itself, never near another
    value, since no single number stands for it."""
    if len(re.findall(r"[.,]", token)) <= 1:
        return [float(token.replace(",", "."))]
    return [part if part.count(".") > 1 else float(part) for part in token.split(",")]


def numbers(text: str) -> set[Value]:
    return {value for token in _NUMBER.findall(text) for value in _values(token)}


def terms(text: str) -> set[str]:
    """English content words cut to 5 letters, and Chinese character pairs (a lone character
    stands for itself)."""
    words = {w[:5] for w in _WORD.findall(text) if w not in _STOP}
    pairs: set[str] = set()
    for run in _CJK_RUN.findall(text):
        pairs |= {run[i : i + 2] for i in range(len(run) - 1)} if len(run) > 1 else {run}
    return words | pairs


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
    """How much of one nugget an answer repeats."""

    stated: float  # share of the nugget's numbers the answer states (1.0 when it has none)
    near: float  # share within 15%
    recall: float  # share of its terms
    has_numbers: bool

    @property
    def label(self) -> str:
        if self.has_numbers:
            if self.stated == 1.0 and self.recall >= 0.5:
                return "full"
            # No value within 15%: the answer states none of its values, or only wrong ones.
            return "partial" if self.near > 0 and self.recall >= 0.25 else "none"
        return "full" if self.recall >= 0.6 else "partial" if self.recall >= 0.3 else "none"


def match(answer: str, nugget: str) -> Match:
    said, wanted = normalised(answer), normalised(nugget)
    values, given = numbers(wanted), numbers(said)
    words, heard = terms(wanted), terms(said)
    share = lambda hits, total: hits / total if total else 1.0  # noqa: E731
    return Match(
        stated=share(sum(v in given for v in values), len(values)),
        near=share(sum(_near(v, given, 0.15) for v in values), len(values)),
        recall=share(len(words & heard), len(words)),
        has_numbers=bool(values),
    )


def evidence(answer: str, nugget: str) -> str:
    """The answer's sentence sharing most of the nugget's terms and numbers ("" if none)."""
    wanted = normalised(nugget)
    parts = terms(wanted) | {str(v) for v in numbers(wanted)}

    def shared(sentence: str) -> int:
        said = normalised(sentence)
        return len(parts & (terms(said) | {str(v) for v in numbers(said)}))

    sentences = [s.strip() for s in _SENTENCE.split(answer) if s.strip()]
    best = max(sentences, key=shared, default="")
    return best[:EVIDENCE_CHARS] if best and shared(best) else ""


def label(answer: str, nugget: str) -> tuple[str, str]:
    """(label, evidence) of one nugget against an answer."""
    if not answer.strip():
        return "none", "none"
    verdict = match(answer, nugget).label
    quote = evidence(answer, nugget)
    if verdict == "full" and _GUESS.search(quote):
        verdict = "partial"
    return verdict, quote if verdict != "none" and quote else "none"
