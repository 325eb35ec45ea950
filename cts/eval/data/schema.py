"""The benchmark's plain data types: instance, golden nugget, and the record of one evaluated key
(docs/data-and-golden.md). The corpus document lives with the search agent that reads it
(cts.webdancer.corpus) and is re-exported here."""

from __future__ import annotations

import math
import unicodedata
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from cts.agents.question_type import QUESTION_TYPES, QuestionType
from cts.webdancer.corpus import CorpusDocument, known_language

#: The kinds of detail a blurred query leaves out are the question types (the taxonomy and its
#: definitions: cts/agents/question_type.py), so that a removed constraint and a clarifying
#: question that asks for it carry the same name.
ConstraintType = QuestionType
CONSTRAINT_TYPES: tuple[str, ...] = QUESTION_TYPES


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Nugget(_Data):
    """One atomic fact a complete answer to the fused query contains."""

    id: str = Field(min_length=1)
    text: str = Field(min_length=1)
    #: Relative importance, at most 1e6 (1e308 passed and overflowed the score's sums to
    #: NaN, a record that every resume and merge then refused).
    weight: float = Field(gt=0, le=1e6)
    #: Evidence (corpus doc ids, or ids in the golden trace) that states the fact.
    source_ids: list[str] = []

    @field_validator("weight")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class GoldenSearcher(_Data):
    """The searcher golden construction ran: with a greedy searcher on this model, an
    evaluation's oracle decodes the very trajectory the nuggets came from
    (cts/eval/run/oracle.py)."""

    #: The searcher's served model name.
    model: str = Field(min_length=1)
    temperature: float = Field(ge=0)


class Golden(_Data):
    nuggets: list[Nugget] = Field(min_length=1)
    #: Golden construction's trace, when the nuggets were extracted from one.
    trace_id: str | None = None
    #: The seed of that golden search run (`golden.seed`, never an evaluation seed).
    seed: int | None = None
    #: Its searcher (None: not recorded, or the nuggets came from no search run).
    searcher: GoldenSearcher | None = None


#: Ids name records and dialogues, and are keys of every join; a bound keeps them sane.
MAX_ID_BYTES = 200


def unsafe_id(value: str) -> str | None:
    """Why `value` is not a usable instance id, or None. Ids reach file names (traces, hashed
    there) and every printed table, so separators, `.`/`..`, NUL and control characters are
    refused at the door rather than escaped everywhere after it."""
    if "/" in value or "\\" in value:
        return "must not contain a path separator ('/' or '\\')"
    if value in (".", ".."):
        return f"must not be {value!r}"
    if any(unicodedata.category(c) == "Cc" for c in value):
        return "must not contain NUL or control characters"
    if len(value.encode("utf-8")) > MAX_ID_BYTES:
        return f"must be at most {MAX_ID_BYTES} UTF-8 bytes"
    return None


#: How deep `meta` may nest: pydantic refuses to serialize much deeper values (~255 levels),
#: which would fail a run at its start (the dataset digest), not at validation.
MAX_META_DEPTH = 100


def _depth(value: Any) -> int:
    """How deeply lists and mappings nest in `value`, counted without recursion (a hostile
    value must not raise RecursionError here)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, (list, tuple)):
            deepest = max(deepest, depth)
            if depth <= MAX_META_DEPTH:  # deeper than that is already too deep
                stack.extend((child, depth + 1) for child in item)
    return deepest


def normal_form(text: str) -> str:
    """`text` for comparing spans: width folded (NFKC: full-width Ｐｒｏ is Pro), case folded,
    whitespace runs as one space."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def _typed_span(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and set(item) == {"type", "span"}
        and all(isinstance(v, str) for v in item.values())
    )


class Instance(_Data):
    id: str = Field(min_length=1)
    #: q: the underspecified query the user typed.
    blurred_query: str = Field(min_length=1)
    #: q*: the user's full intent. Only the user answerer, golden builder and judge see it.
    fused_query: str = Field(min_length=1)
    language: str = "en"
    #: The types of the constraints blurring removed. A dataset may give each as
    #: `{type, span}`, `span` being the removed text, in the fused query and absent from the
    #: blurred query (compared in `normal_form`): the types land here, the spans in
    #: `removed_spans`.
    removed_constraints: list[ConstraintType] = []
    #: Per removed constraint, its span ("" where the dataset gave a type only); empty when
    #: it gave types only.
    removed_spans: list[str] = []
    golden: Golden | None = None
    meta: dict[str, Any] = {}

    @model_validator(mode="before")
    @classmethod
    def _split_typed_spans(cls, data: Any) -> Any:
        """`removed_constraints: [{type, span}, …]` into the types and the spans. An item
        that is not a {type, span} object is left as it is, for the type check to report."""
        items = data.get("removed_constraints") if isinstance(data, dict) else None
        if not isinstance(items, list) or not any(isinstance(i, dict) for i in items):
            return data
        if not all(_typed_span(i) or isinstance(i, str) for i in items):
            return data
        return {
            **data,
            "removed_constraints": [i["type"] if isinstance(i, dict) else i for i in items],
            "removed_spans": [i["span"] if isinstance(i, dict) else "" for i in items],
        }

    @model_validator(mode="after")
    def _spans_were_removed(self) -> Instance:
        if self.removed_spans and len(self.removed_spans) != len(self.removed_constraints):
            raise PydanticCustomError(
                "removed_spans", "removed_spans must have one span per removed constraint"
            )
        for n, span in enumerate(self.removed_spans):
            # `field` names the input's field in a dataset problem (cts/eval/data/dataset.py).
            where = {"field": f"removed_constraints[{n}].span", "span": repr(span)}
            if span and normal_form(span) not in normal_form(self.fused_query):
                raise PydanticCustomError("removed_span", "{span} is not in fused_query", where)
            if span and normal_form(span) in normal_form(self.blurred_query):
                raise PydanticCustomError("removed_span", "{span} is still in blurred_query", where)
        return self

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Dumped as a dataset gives it: spans inside `removed_constraints`, so that a dataset
        without spans dumps (and digests) as before they existed."""
        data: dict[str, Any] = handler(self)
        spans = data.pop("removed_spans", [])
        if spans and "removed_constraints" in data:
            data["removed_constraints"] = [
                {"type": t, "span": s} if s else t
                for t, s in zip(data["removed_constraints"], spans, strict=True)
            ]
        return data

    @field_validator("id")
    @classmethod
    def _safe_id(cls, value: str) -> str:
        reason = unsafe_id(value)
        if reason is not None:
            # A custom error keeps the message free of pydantic's "Value error, " prefix.
            raise PydanticCustomError("unsafe_id", reason)
        return value

    @field_validator("meta")
    @classmethod
    def _shallow_meta(cls, value: dict[str, Any]) -> dict[str, Any]:
        if _depth(value) > MAX_META_DEPTH:
            raise PydanticCustomError("too_deep", f"nested more than {MAX_META_DEPTH} levels deep")
        return value


class Canary(BaseModel):
    """What the judge said about a record's nuggets against an answer that states none of them
    (the answer-independence canary, `judge.canary`): every label should be `none`."""

    #: Which answer: `empty` or `unrelated`.
    answer: str
    #: nugget id → label.
    labels: dict[str, str] = {}
    #: Why the canary's judge call failed (the record itself is not failed by it).
    error: str | None = None


class Record(BaseModel):
    """One line of records/<condition>/shard-<i>-of-<n>.jsonl.

    Not `_Data`: records written by earlier versions must keep reading, whatever they hold."""

    instance_id: str
    condition: str
    seed: int
    #: The instance's language and removed constraint types, for the report's breakdowns.
    language: str = ""
    removed_constraints: list[str] = []
    questions: list[str] = []
    answers: list[str] = []
    #: Per question, every type it asks about.
    question_types: list[list[str]] = []
    #: Abstractive User Answerer only: per answer, content words not in the fused query.
    unsupported_words: list[list[str]] = []
    #: Per answer, what it gives away of the fused query's missing information
    #: (cts/eval/score/over_answer.py `Reveal`: revealed, pieces, basis, share, needed).
    answer_reveals: list[dict[str, Any]] = []
    stopped_early: bool = False
    #: The question the Clarifier wrote beside its stop (sequential mode, `allow_stop`).
    stop_question: str = ""
    rewrite: str | None = None
    search_query: str = ""
    answer: str = ""
    termination: str = ""
    doc_ids: list[str] = []
    trace_id: str | None = None
    #: Golden construction only: the nuggets extracted from this (fused-query) search run.
    nuggets: list[Nugget] = []
    labels: dict[str, dict[str, str]] = {}
    scores: dict[str, float] = {}
    #: The answer-independence canary, on the records `judge.canary` draws.
    canary: Canary | None = None
    usage: dict[str, int] = {}
    seconds: float = 0.0
    #: {kind, stage, message} when the instance failed; the run goes on.
    error: dict[str, str] | None = None

    @field_validator("question_types", mode="before")
    @classmethod
    def _one_type_each_before(cls, value: Any) -> Any:
        # Records written before questions could have several types hold one per question.
        if isinstance(value, list):
            return [[v] if isinstance(v, str) else v for v in value]
        return value

    @classmethod
    def for_key(cls, instance: Instance, condition: str, seed: int, **fields: Any) -> Record:
        """A record of `instance` under `condition` and `seed`, carrying the instance's
        language and removed constraint types for the report's breakdowns."""
        return cls(
            instance_id=instance.id,
            condition=condition,
            seed=seed,
            language=instance.language,
            removed_constraints=list(instance.removed_constraints),
            **fields,
        )

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.instance_id, self.condition, self.seed)

    @property
    def scored(self) -> bool:
        return self.error is None and bool(self.scores)


__all__ = [
    "CONSTRAINT_TYPES",
    "Canary",
    "ConstraintType",
    "CorpusDocument",
    "Golden",
    "GoldenSearcher",
    "Instance",
    "Nugget",
    "Record",
    "known_language",
    "normal_form",
    "unsafe_id",
]
