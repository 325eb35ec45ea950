"""The benchmark's plain data types: instance, golden nugget, corpus document (DESIGN §6)."""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

ConstraintType = Literal["time", "region", "scope", "entity", "numeric", "definition", "other"]
CONSTRAINT_TYPES: tuple[str, ...] = get_args(ConstraintType)

# ISO 639-1. A language tag is valid when its primary subtag is one of these ("zh", "zh-CN").
ISO_639_1 = frozenset(
    (
        "aa ab ae af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca ce ch co cr cs cu "
        "cv cy da de dv dz ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi "
        "ho hr ht hu hy hz ia id ie ig ii ik io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks "
        "ku kv kw ky la lb lg li ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd ne ng nl "
        "nn no nr nv ny oc oj om or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd se sg si sk sl "
        "sm sn so sq sr ss st su sv sw ta te tg th ti tk tl tn to tr ts tt tw ty ug uk ur uz ve "
        "vi vo wa wo xh yi yo za zh zu"
    ).split()
)


def known_language(tag: str) -> bool:
    return tag.split("-")[0].split("_")[0].lower() in ISO_639_1


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


class CorpusDocument(_Data):
    doc_id: str = Field(min_length=1)
    url: str = Field(min_length=1)
    title: str = ""
    text: str = Field(min_length=1)
    date: str | None = None
    language: str | None = None
