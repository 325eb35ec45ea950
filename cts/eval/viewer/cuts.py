"""How much of a text one sample shows: every text cut at MAX_FIELD_CHARS, saying its length, and
nothing nested deeper than MAX_DEPTH. Apart because both the trace's turns (cts/eval/viewer/
trace.py) and the sample around them (cts/eval/viewer/sample.py) cut with the same Cuts, and the
bound is its own decision (RELIABILITY.md: a sample's work stops growing at the cap).
"""

from __future__ import annotations

from typing import Any

#: The most characters of one text a sample shows (an answer, a model turn, a tool's response,
#: a quote): a longer one is cut, saying its length, and the raw record or trace (/api/raw)
#: holds it whole. Every parse and mark works on cut text, so a request's work is linear in
#: what it reads and bounded, whatever a record or trace holds.
MAX_FIELD_CHARS = 20_000
#: JSON nested deeper than this (a tool call's arguments) is shown as a note, not sent.
MAX_DEPTH = 32


class Cuts:
    """Cuts every text a sample shows to MAX_FIELD_CHARS, and remembers whether it cut one."""

    def __init__(self, limit: int = MAX_FIELD_CHARS) -> None:
        self.limit = limit
        self.cut = False

    def text(self, value: str) -> str:
        if len(value) <= self.limit:
            return value
        self.cut = True
        return (
            value[: self.limit]
            + f"\n… [cut: {len(value):,} characters in all; the raw file holds them all]"
        )

    def json(self, value: Any, depth: int = 0) -> Any:
        """`value` with every string cut and nothing nested deeper than MAX_DEPTH."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, (dict, list)) and depth >= MAX_DEPTH:
            self.cut = True
            return f"[nested more than {MAX_DEPTH} deep: the raw file holds it]"
        if isinstance(value, dict):
            return {self.text(str(k)): self.json(v, depth + 1) for k, v in value.items()}
        if isinstance(value, list):
            return [self.json(v, depth + 1) for v in value]
        return value
