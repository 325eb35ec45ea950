"""How far to trust the simulated user: the User Answerer's answers against a careful person's.

Each row of a labels JSONL is one clarifying question about one fused query, with `expected`:
the value a careful person copies from the fused query to answer it, or `unknown` when the
fused query does not say (the shipped set's rules: sample_data/answerer_labels.md). The
experiment's User Answerer — its model and sampling, and the `clarification.answerer` and
`clarification.answer_span` options, called as a run's dialogue calls it (cts/eval/run/dialogue.py),
seeded with the experiment's first seed, the response cache off — answers every row once.

The figures, each over the rows it can be computed on (its n):

- **exact match**: the normalised answer equals the normalised expected answer (all rows; on
  an `unknown` row, the answer is `unknown`);
- **containment match**: the normalised answer contains the normalised expected answer as a
  run of whole tokens (`2024` in `spring 2024`, not `men` in `women`); on an `unknown` row,
  the answer is `unknown`;
- **false unknown**: of the rows with a value, the share answered `unknown`;
- **false answer**: of the `unknown` rows, the share answered with a value (the attribute is
  absent from the fused query, and the answerer made one up or copied something else);
- **over-disclosure**: of the rows with a value answered with a value, the share whose answer
  contains a *disclosure value* of the fused query that is contained neither in the expected
  answer, nor in the question, nor (when the row gives it) in the blurred query — the answer
  told the clarifier something it did not ask for and did not already know — or, on a row
  that records its instance's removed spans, *reveals a removed span* it was not asked for.

A row may record its instance's removed constraints as a dataset gives them
(`removed_constraints`: types, or `{type, span}` objects; each span in the fused query and
not in the blurred query, compared in `normal_form`). Where at least one span is recorded,
the row asks about the removed constraints of its `constraint_type` (none, for a type not
removed or an untyped row); every other removed constraint with a span is one the question did
not ask about, and the answer **reveals** it when it holds one of the span's units (the User
Answerer's: a word, or one CJK character; case- and width-folded) that is neither a function
word (the, of, in …; 的, 在 …) nor a unit of the expected answer, the question, the blurred
query or an asked span. Units are found by position where the answer is a substring of the
fused query (of several occurrences, the one revealing fewest spans), by value otherwise (an
abstractive answer). A row without spans is scored by the disclosure values alone, exactly as
before spans existed.

The disclosure values of a fused query are (after NFKC, so full-width digits are digits):

1. every number: a letter/digit word holding a digit, joiners inside it kept (`2024`,
   `250,000`, `65-inch`, `AL-72`, `CO2`);
2. every capitalised word that does not open a sentence, but `I`, without a possessive `'s`
   (`Korvex`, `Orrisford`, `PDF`, `Council` of `Council's`): proper nouns and acronyms;
3. every quoted span, between '…' "…" “…” ‘…’ 「…」 『…』 《…》;
4. every Chinese name of a place or body: the two characters before 省 市 县 州 镇 (市 not
   starting 市场 市民 市值 市区), 学院 大学 学会 医学会 协会 基金 基金会 公司 集团 医院 银行,
   with that suffix (`溪川市`, `师范学院`, `华岳医学会`);
5. the expected value of every other row of the labels file with the same fused query, so a
   qualifier the set singles out elsewhere (`night trains`, `大型犬`) counts as a value too.

Normalised: NFKC (full-width to half-width), case-folded, every punctuation character a
space, whitespace collapsed; a CJK character is a token of its own, any other run of
non-space characters one token. An answer whose call fails is left out of every figure and
listed with why."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cts.agents import user_answerer
from cts.agents.types import UNKNOWN
from cts.agents.user_answerer import SpanLimits
from cts.eval.audit.answer_match import (
    LabelledQuestion,
    contains,
    disclosure_values,
    is_unknown,
    normalise,
    revealed_spans,
)
from cts.eval.data.dataset import SAMPLE_DIR, field_problems, labelled_rows, refuse_labels
from cts.eval.data.schema import CONSTRAINT_TYPES, known_language, normal_form
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import ClarificationConfig
from cts.eval.run.engines import open_engines
from cts.eval.score.kappa import Rate
from cts.serving.engine import ChatModel
from cts.serving.errors import EngineError
from cts.serving.types import Sampling

#: The labelled set shipped with the toolkit (`--labels sample`).
SAMPLE_ANSWERER_LABELS = SAMPLE_DIR / "answerer_labels.jsonl"
#: The bucket of rows without a constraint type.
UNTYPED = "untyped"

_REQUIRED = ("fused_query", "question", "expected")
_OPTIONAL = (
    "id",
    "language",
    "constraint_type",
    "blurred_query",
    "instance_id",
    "note",
    "removed_constraints",
)
#: Optional fields that are not text.
_NOT_TEXT = ("removed_constraints",)


# -- the labelled set -------------------------------------------------------------------------


@dataclass(frozen=True)
class AnswerLabelSet:
    path: str
    items: tuple[LabelledQuestion, ...]

    def siblings(self, item: LabelledQuestion) -> list[str]:
        """The expected values of the other rows about the same fused query."""
        return [
            other.expected
            for other in self.items
            if other.fused_query == item.fused_query and other.expects_value and other is not item
        ]


def labels_path(labels: str | Path) -> Path:
    """`sample` is the shipped set; anything else a path."""
    return SAMPLE_ANSWERER_LABELS if str(labels) == "sample" else Path(labels).expanduser()


#: (field, message) of one problem in a row.
Found = tuple[str, str]


def _text(data: dict[str, Any], key: str) -> list[Found]:
    value = data.get(key)
    if not isinstance(value, str):
        return [(key, f"must be a string, got {type(value).__name__}")]
    if not value.strip():
        return [(key, "empty")]
    return []


def read_answer_labels(labels: str | Path) -> AnswerLabelSet:
    """Every row of an answerer labels JSONL; DatasetError listing every bad row as
    `file:line: field: message`."""
    path = labels_path(labels)
    rows, problems = labelled_rows(path, _row_problems)
    items = [_item(data, line) for line, data in rows]
    refuse_labels(str(path), problems, len(items))
    return AnswerLabelSet(str(path), tuple(items))


def _row_problems(data: dict[str, Any], ids: dict[str, int], line: int) -> list[Found]:
    problems = field_problems(data, _REQUIRED, _OPTIONAL)
    for key in data:
        if key in _REQUIRED or (
            key in _OPTIONAL and key not in _NOT_TEXT and data[key] is not None
        ):
            problems += _text(data, key)
    problems += _removed_problems(data)
    bad = {key for key, _ in problems}
    expected, fused = data.get("expected"), data.get("fused_query")
    if (
        isinstance(expected, str)
        and isinstance(fused, str)
        and not bad & {"expected", "fused_query"}
    ):
        if expected != UNKNOWN and normalise(expected) in (UNKNOWN, normalise("未知")):
            problems.append(("expected", f"write `{UNKNOWN}` exactly, got {expected!r}"))
        elif expected != UNKNOWN and not contains(fused, expected):
            problems.append(
                (
                    "expected",
                    f"{expected!r} is not in the fused query: copy a span of it, or "
                    f"write `{UNKNOWN}`",
                )
            )
    language = data.get("language")
    if "language" not in bad and isinstance(language, str) and not known_language(language):
        problems.append(("language", f"unknown language {language!r} (an ISO 639-1 code)"))
    kind = data.get("constraint_type")
    if "constraint_type" not in bad and kind is not None and kind not in CONSTRAINT_TYPES:
        problems.append(
            ("constraint_type", f"must be one of {', '.join(CONSTRAINT_TYPES)}, got {kind!r}")
        )
    row_id = data.get("id")
    if "id" not in bad and isinstance(row_id, str):
        if row_id in ids:
            problems.append(("id", f"duplicate: {row_id!r} is also on line {ids[row_id]}"))
        else:
            ids[row_id] = line
    return problems


def _removed_item(item: Any) -> tuple[Any, Any] | None:
    """(type, span) of one `removed_constraints` item, or None for an item of another shape."""
    if isinstance(item, str):
        return item, ""
    if isinstance(item, dict) and set(item) == {"type", "span"}:
        return item["type"], item["span"]
    return None


def _removed_problems(data: dict[str, Any]) -> list[Found]:
    """What is wrong with a row's `removed_constraints`, checked as a dataset's are
    (cts/eval/data/schema.Instance): a span must be what blurring removed."""
    items = data.get("removed_constraints")
    if items is None:
        return []
    if not isinstance(items, list):
        return [("removed_constraints", f"must be a list, got {type(items).__name__}")]
    fused, blurred = data.get("fused_query"), data.get("blurred_query")
    problems: list[Found] = []
    for n, item in enumerate(items):
        where = f"removed_constraints[{n}]"
        found = _removed_item(item)
        if found is None or not isinstance(found[1], str):
            problems.append((where, "must be a type or a {type, span} object (span a string)"))
            continue
        kind, span = found
        if kind not in CONSTRAINT_TYPES:
            problems.append((where, f"must be one of {', '.join(CONSTRAINT_TYPES)}, got {kind!r}"))
        if span and isinstance(fused, str) and normal_form(span) not in normal_form(fused):
            problems.append((f"{where}.span", f"{span!r} is not in fused_query"))
        if span and isinstance(blurred, str) and normal_form(span) in normal_form(blurred):
            problems.append((f"{where}.span", f"{span!r} is still in blurred_query"))
    return problems


def _item(data: dict[str, Any], line: int) -> LabelledQuestion:
    return LabelledQuestion(
        id=data.get("id") or f"line {line}",
        line=line,
        fused_query=data["fused_query"],
        question=data["question"],
        expected=data["expected"],
        language=data.get("language") or "en",
        constraint_type=data.get("constraint_type") or UNTYPED,
        blurred_query=data.get("blurred_query"),
        note=data.get("note"),
        removed=tuple(
            (str(kind), str(span))
            for kind, span in filter(
                None, map(_removed_item, data.get("removed_constraints") or [])
            )
        ),
    )


# -- scoring ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One answer against its row."""

    id: str
    language: str
    constraint_type: str
    question: str
    expected: str
    answer: str
    exact: bool
    contained: bool
    #: Disclosure values the answer gives beyond the expected answer, the question and the
    #: blurred query (checked only on rows with a value answered with a value); one inside
    #: another is named by the longer.
    disclosed: tuple[str, ...]
    #: Removed spans of constraints the question did not ask about that the answer reveals
    #: (rows that record their instance's spans only; checked where `disclosed` is).
    revealed: tuple[str, ...] = ()

    @property
    def over_discloses(self) -> bool:
        return bool(self.disclosed or self.revealed)

    @property
    def outcome(self) -> str:
        """exact, contained, false unknown, false answer, or wrong (a value without the
        expected one)."""
        if self.exact:
            return "exact"
        if self.contained:
            return "contained"
        if self.expected == UNKNOWN:
            return "false answer"
        return "false unknown" if is_unknown(self.answer) else "wrong"


def score(item: LabelledQuestion, answer: str, siblings: Sequence[str] = ()) -> Verdict:
    """`answer` against `item`; `siblings`: the expected values of the other rows about the
    same fused query (disclosure rule 5)."""
    disclosed: tuple[str, ...] = ()
    revealed: tuple[str, ...] = ()
    if not item.expects_value or is_unknown(answer):
        # `unknown` is right exactly when it was expected.
        exact = contained = not item.expects_value and is_unknown(answer)
    else:
        exact = normalise(answer) == normalise(item.expected)
        contained = contains(answer, item.expected)
        known = [k for k in (item.expected, item.question, item.blurred_query) if k]
        given = [
            value
            for value in dict.fromkeys([*disclosure_values(item.fused_query), *siblings])
            if contains(answer, value) and not any(contains(k, value) for k in known)
        ]
        # A value inside another one given (`2025` in `2025年`) is named once, by the longer.
        disclosed = tuple(v for v in given if not any(o != v and contains(o, v) for o in given))
        revealed = revealed_spans(item, answer)
    return Verdict(
        id=item.id,
        language=item.language,
        constraint_type=item.constraint_type,
        question=item.question,
        expected=item.expected,
        answer=answer,
        exact=exact,
        contained=contained,
        disclosed=disclosed,
        revealed=revealed,
    )


@dataclass(frozen=True)
class Figures:
    #: Rows answered (failed calls left out).
    n: int
    exact: Rate
    containment: Rate
    #: Over the rows with a value.
    false_unknown: Rate
    #: Over the `unknown` rows.
    false_answer: Rate
    #: Over the rows with a value answered with a value.
    over_disclosure: Rate


def figures(verdicts: Sequence[Verdict]) -> Figures:
    values = [v for v in verdicts if v.expected != UNKNOWN]
    unknowns = [v for v in verdicts if v.expected == UNKNOWN]
    answered = [v for v in values if not is_unknown(v.answer)]
    return Figures(
        n=len(verdicts),
        exact=Rate(len(verdicts), sum(v.exact for v in verdicts)),
        containment=Rate(len(verdicts), sum(v.contained for v in verdicts)),
        false_unknown=Rate(len(values), sum(is_unknown(v.answer) for v in values)),
        false_answer=Rate(len(unknowns), sum(not is_unknown(v.answer) for v in unknowns)),
        over_disclosure=Rate(len(answered), sum(v.over_discloses for v in answered)),
    )


def _by(verdicts: Sequence[Verdict], key: Callable[[Verdict], str]) -> dict[str, Figures]:
    groups: dict[str, list[Verdict]] = {}
    for v in verdicts:
        groups.setdefault(key(v), []).append(v)
    return {name: figures(found) for name, found in sorted(groups.items())}


@dataclass
class AnswererCalibration:
    labels_file: str
    items: int
    #: `extractive` or `abstractive` (clarification.answerer).
    answerer: str
    #: The seed every request was sent with (the experiment's first).
    seed: int
    figures: Figures
    by_language: dict[str, Figures]
    by_constraint_type: dict[str, Figures]
    #: Every answered row, in file order.
    verdicts: list[Verdict]
    #: The rows whose call failed, and why.
    failed: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        doc = asdict(self)

        def shares(found: Figures, out: dict[str, Any]) -> None:
            for name in ("exact", "containment", "false_unknown", "false_answer"):
                out[name]["share"] = getattr(found, name).share
            out["over_disclosure"]["share"] = found.over_disclosure.share

        shares(self.figures, doc["figures"])
        for table in ("by_language", "by_constraint_type"):
            for name, found in getattr(self, table).items():
                shares(found, doc[table][name])
        for verdict, out in zip(self.verdicts, doc["verdicts"], strict=True):
            out["outcome"] = verdict.outcome
        return doc

    @property
    def cases(self) -> list[Verdict]:
        """The answers a person should look at: every one not an exact match, and every one
        that over-discloses."""
        return [v for v in self.verdicts if not v.exact or v.over_discloses]


#: One User Answerer call per row: its answer.
AnswerCall = Callable[[LabelledQuestion], Awaitable[str]]


async def calibrate(
    call: AnswerCall,
    labels: AnswerLabelSet,
    answerer: str = "extractive",
    seed: int = 0,
    concurrency: int = 4,
) -> AnswererCalibration:
    """Every row answered once, and every figure from the answers."""
    limit = asyncio.Semaphore(concurrency)
    answers: dict[str, str] = {}
    failed: dict[str, str] = {}

    async def one(item: LabelledQuestion) -> None:
        async with limit:
            try:
                answers[item.id] = await call(item)
            except EngineError as e:
                failed[item.id] = f"{type(e).__name__}: {e}"[:300]

    await asyncio.gather(*(one(item) for item in labels.items))
    verdicts = [
        score(item, answers[item.id], labels.siblings(item))
        for item in labels.items
        if item.id in answers
    ]
    return AnswererCalibration(
        labels_file=labels.path,
        items=len(labels.items),
        answerer=answerer,
        seed=seed,
        figures=figures(verdicts),
        by_language=_by(verdicts, lambda v: v.language),
        by_constraint_type=_by(verdicts, lambda v: v.constraint_type),
        verdicts=verdicts,
        failed={item.id: failed[item.id] for item in labels.items if item.id in failed},
    )


def answerer_call(
    engine: ChatModel, sampling: Sampling, options: ClarificationConfig
) -> AnswerCall:
    """The configured User Answerer on one row, as a run's dialogue asks it
    (cts/eval/run/dialogue.Clarification._answer): the fused query and the question only, in the
    row's language, with the answerer mode and span limits of `clarification`."""
    limits = SpanLimits(**options.answer_span.model_dump())

    async def call(item: LabelledQuestion) -> str:
        return await user_answerer.answer(
            engine,
            item.fused_query,
            item.question,
            item.language,
            sampling,
            mode=options.answerer,
            limits=limits,
        )

    return call


def calibrate_experiment(
    resolved: ResolvedExperiment, labels: AnswerLabelSet
) -> AnswererCalibration:
    """The experiment's user_answerer role on `labels`, with the response cache off (a cached
    answer would hide what the answerer does today), seeded with the first evaluation seed."""
    experiment = resolved.experiment
    seed = experiment.seeds[0]

    async def go() -> AnswererCalibration:
        async with open_engines(resolved, roles=["user_answerer"], use_cache=False) as engines:
            sampling = resolved.sampling_for("user_answerer").with_seed(seed)
            options = experiment.clarification
            call = answerer_call(engines.roles["user_answerer"], sampling, options)
            return await calibrate(call, labels, options.answerer, seed, experiment.concurrency)

    return asyncio.run(go())


# -- the report -------------------------------------------------------------------------------


def _rate(rate: Rate) -> str:
    return "n/a" if rate.share is None else f"{100 * rate.share:.1f}% ({rate.count})"


def _cell(rate: Rate) -> str:
    return "–" if rate.share is None else f"{100 * rate.share:.0f}% ({rate.count}/{rate.n})"


def _table(title: str, heading: str, rows: dict[str, Figures]) -> list[str]:
    lines = [
        f"### {title}",
        "",
        f"| {heading} | n | exact | containment | false unknown | false answer | over-disclosure |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, f in rows.items():
        cells = [f.exact, f.containment, f.false_unknown, f.false_answer, f.over_disclosure]
        lines.append(f"| {name} | {f.n} | " + " | ".join(_cell(c) for c in cells) + " |")
    return [*lines, ""]


def _quote(text: str) -> str:
    return "`" + text.replace("`", "'").replace("\n", " ") + "`"


def render(result: AnswererCalibration, answerer_name: str = "", cases: int = 40) -> str:
    """The figures as Markdown, each with its n, then the cases (at most `cases` listed)."""
    f = result.figures
    who = f" ({answerer_name})" if answerer_name else ""
    values = f.false_unknown.n
    lines = [
        f"## User Answerer calibration{who}",
        "",
        f"{result.labels_file}: {result.items} questions, {values} with a value and "
        f"{f.false_answer.n} `unknown` answered; {result.answerer} answerer, seed {result.seed}.",
        "",
        "| figure | value | n |",
        "|---|---|---|",
        f"| exact match (normalised) | {_rate(f.exact)} | {f.exact.n} |",
        f"| containment match (the answer holds the expected value) | {_rate(f.containment)} | "
        f"{f.containment.n} |",
        f"| false unknown (`unknown` where a value was expected) | {_rate(f.false_unknown)} | "
        f"{f.false_unknown.n} |",
        f"| false answer (a value where `unknown` was expected) | {_rate(f.false_answer)} | "
        f"{f.false_answer.n} |",
        f"| over-disclosure (a value answer giving a value not asked for) | "
        f"{_rate(f.over_disclosure)} | {f.over_disclosure.n} |",
        "",
    ]
    lines += _table("By language", "language", result.by_language)
    lines += _table("By constraint type", "constraint type", result.by_constraint_type)
    listed = result.cases
    lines += [
        f"### Cases ({len(listed)}: not an exact match, or over-disclosing)",
        "",
    ]
    for v in listed[:cases]:
        extra = f"; discloses {', '.join(_quote(d) for d in v.disclosed)}" if v.disclosed else ""
        if v.revealed:
            extra += f"; reveals removed {', '.join(_quote(r) for r in v.revealed)}"
        lines.append(
            f"- {v.id} [{v.language}, {v.constraint_type}] {v.outcome}: {_quote(v.question)} "
            f"expected {_quote(v.expected)}, answered {_quote(v.answer)}{extra}"
        )
    if len(listed) > cases:
        lines.append(f"- … {len(listed) - cases} more (--out lists every answer)")
    if result.failed:
        lines += ["", f"{len(result.failed)} question(s) failed and are left out:"]
        lines += [f"- {item}: {why}" for item, why in list(result.failed.items())[:20]]
    return "\n".join(lines).rstrip() + "\n"
