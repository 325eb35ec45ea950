"""The benchmark's plain data types: instance and golden nugget (DESIGN §6). The corpus document
lives with the search agent that reads it (webdancer.corpus) and is re-exported here."""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from webdancer.corpus import CorpusDocument, known_language

ConstraintType = Literal["time", "region", "scope", "entity", "numeric", "definition", "other"]
CONSTRAINT_TYPES: tuple[str, ...] = get_args(ConstraintType)


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Nugget(_Data):
    """One atomic fact a complete answer to the fused query contains."""

    id: str = Field(min_length=1)
    text: str = Field(min_length=1)
    weight: float = Field(gt=0)
    #: Evidence (corpus doc ids, or ids in the golden trace) that states the fact.
    source_ids: list[str] = []

    @field_validator("weight")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class Golden(_Data):
    nuggets: list[Nugget] = Field(min_length=1)
    #: Golden construction's trace, when the nuggets were extracted from one.
    trace_id: str | None = None
    #: The seed of that golden search run (`golden.seed`, never an evaluation seed).
    seed: int | None = None


class Instance(_Data):
    id: str = Field(min_length=1)
    #: q: the underspecified query the user typed.
    blurred_query: str = Field(min_length=1)
    #: q*: the user's full intent. Only the user answerer, golden builder and judge see it.
    fused_query: str = Field(min_length=1)
    language: str = "en"
    removed_constraints: list[ConstraintType] = []
    golden: Golden | None = None
    meta: dict[str, Any] = {}


__all__ = [
    "CONSTRAINT_TYPES",
    "ConstraintType",
    "CorpusDocument",
    "Golden",
    "Instance",
    "Nugget",
    "known_language",
]
