"""Plain data the roles exchange."""

from __future__ import annotations

from pydantic import BaseModel

UNKNOWN = "unknown"


class QA(BaseModel):
    """One clarification turn: the Clarifier's question and the User Answerer's answer."""

    question: str
    answer: str

    @property
    def unknown(self) -> bool:
        return self.answer == UNKNOWN


def history_text(pairs: list[QA], language: str) -> str:
    """Earlier turns as the Clarifier and Rewriter read them."""
    if not pairs:
        return ""
    q, a = ("问", "答") if language.lower().startswith("zh") else ("Q", "A")
    return "\n".join(f"{q}{i}: {p.question}\n{a}{i}: {p.answer}" for i, p in enumerate(pairs, 1))
