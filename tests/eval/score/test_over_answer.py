"""Over-answering: the measure against hand-labelled answers, its rate in the report, and the
opt-in cap on the share of the fused query one answer may hold."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re

import pytest

from cts.agents import user_answerer
from cts.agents.user_answerer import SpanLimits, is_span, span_regex
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Instance, Record
from cts.eval.report.diagnostics import score_records, summarize
from cts.eval.report.dialogue_diagnostics import clarification
from cts.eval.report.markdown import markdown
from cts.eval.run.config_sections import AnswerSpan, ClarificationConfig
from cts.eval.run.dialogue import _fingerprint
from cts.eval.run.pipeline import run_instance
from cts.eval.score.over_answer import reveal
from cts.serving.errors import ConstrainedOutputError
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import Sampling
from tests.scripted import scripted_context

TAX = Instance(
    id="tax",
    blurred_query="How much is the overnight tourist tax for hotel stays?",
    fused_query="How much is the overnight tourist tax for hotel stays in Calvanne in 2025?",
    removed_constraints=["region", "time"],
)
RENT = Instance(
    id="rent",
    language="zh",
    blurred_query="公租房申请的收入标准是多少？",
    fused_query="溪川市2025年公租房申请的收入标准是多少？",
    removed_constraints=["region", "time"],
)
PASS = Instance(
    id="pass",
    blurred_query="How much does a monthly commuter pass cost on regional rail?",
    fused_query="How much does a monthly commuter pass cost on Vendrick Valley regional rail?",
    removed_constraints=["region"],
)
PORT = Instance(
    id="port",
    blurred_query="How many ships called at the harbour?",
    fused_query="How many ships called at the Port Haldane harbour in the first quarter of 2024?",
    removed_constraints=["region", "time"],
)
# The same instance with its removed spans recorded: the pieces are exact.
PORT_SPANS = PORT.model_copy(update={"removed_spans": ["Port Haldane", "first quarter of 2024"]})
# A span that starts with a function word.
PORT_THE = PORT.model_copy(update={"removed_spans": ["Port Haldane", "the first quarter of 2024"]})
# Spans as the dataset's check accepts them, in another case or width than the fused query.
TAX_SPANS = TAX.model_copy(update={"removed_spans": ["CALVANNE", "2025"]})
RENT_SPANS = RENT.model_copy(update={"removed_spans": ["溪川市", "２０２５年"]})
TOUR = Instance(
    id="tour",
    blurred_query="Which museums open late?",
    fused_query="Which museums in Oslo open late on Fridays?",
    removed_constraints=[],
)

#: (instance, answer, over-answers?, holds most of the fused query?), labelled by hand: an
#: answer over-answers when it gives away more than one of the attributes blurring removed.
LABELLED = [
    (TAX, "Calvanne", False, False),
    (TAX, "2025", False, False),
    (TAX, "in Calvanne", False, False),
    (TAX, "Calvanne in 2025", True, False),
    (TAX, TAX.fused_query, True, True),
    (TAX, "hotel stays", False, False),  # known already: reveals nothing
    (TAX, "Calvanne, 2025", True, False),  # worded freely (abstractive): by value
    (TAX, "unknown", False, False),
    (RENT, "溪川市", False, False),
    (RENT, "2025年", False, False),
    (RENT, "溪川市2025年", True, False),
    (RENT, RENT.fused_query, True, True),
    # One removed constraint: the whole fused query gives away one attribute, and most of it.
    (PASS, "Vendrick Valley", False, False),
    (PASS, PASS.fused_query, False, True),
    # Without spans the proxy cuts "first quarter of 2024" in two: one attribute, not over.
    (PORT, "first quarter of 2024", False, False),
    (PORT, "Port Haldane", False, False),
    (PORT, "Port Haldane harbour in the first quarter of 2024", True, True),
    (PORT_SPANS, "first quarter of 2024", False, False),
    (PORT_SPANS, "Port Haldane harbour in the first quarter", True, False),
    # Spans found in normal form: each is a piece, as written in the dataset or not.
    (TAX_SPANS, "Calvanne in 2025", True, False),
    (RENT_SPANS, "溪川市2025年", True, False),
    # Worded freely: a function word ("the") or one CJK character (市, of many a word) is not
    # the attribute the fused query's word holds.
    (PORT_THE, "the harbour at Haldane port", False, False),
    (RENT, "那个城市在2025年", False, False),
    (RENT, "溪川2025年", True, False),
    # No removed constraint recorded: runs of missing words are the pieces.
    (TOUR, "Oslo", False, False),
    (TOUR, "in Oslo open late on Fridays", True, True),
]


@pytest.mark.parametrize(("instance", "answer", "over", "most"), LABELLED)
def test_over_answering_matches_hand_labels(instance, answer, over, most):
    found = reveal(instance, answer)
    assert (found.over, found.most) == (over, most), found


def test_pieces_and_their_basis():
    assert (reveal(TAX, "x").pieces, reveal(TAX, "x").basis) == (2, "runs")
    assert (reveal(PASS, "x").pieces, reveal(PASS, "x").basis) == (1, "one_constraint")
    assert (reveal(PORT, "x").pieces, reveal(PORT, "x").needed) == (3, 3)
    assert (reveal(PORT_SPANS, "x").pieces, reveal(PORT_SPANS, "x").basis) == (2, "spans")
    # Spans in another case or width are found (they were dropped: no piece, no over-answer).
    assert (reveal(TAX_SPANS, "x").pieces, reveal(RENT_SPANS, "x").pieces) == (2, 2)
    assert reveal(TAX, TAX.fused_query).share == 1.0


def _rec(k: int, answers: list[str], reveals: list[dict] | None = None, i: str = "a") -> Record:
    return Record(
        instance_id=i,
        condition=f"clarify@{k}",
        seed=0,
        questions=[f"q{n}" for n in range(len(answers))],
        answers=answers,
        question_types=[["other"]] * len(answers),
        answer_reveals=reveals if reveals is not None else [],
        scores={"restore_score_100": 10.0, "strict": 10.0, "unweighted": 10.0},
    )


def test_the_over_answer_rate_per_k_against_a_hand_computation():
    """k=1: answers "Calvanne" (one piece) and the whole fused query (two pieces, most of
    it): 1 over-answer of 2 answers, 1 of 2 holding most. k=2: "Calvanne in 2025" (over),
    `unknown` (not counted), "2025": 1 of 2. A record written before answers were measured
    (no reveals) is left out and counted."""
    one = [reveal(TAX, a).as_dict() for a in ("Calvanne", TAX.fused_query)]
    two = [reveal(TAX, a).as_dict() for a in ("Calvanne in 2025", "unknown")]
    records = [
        _rec(1, ["Calvanne"], one[:1], "a"),
        _rec(1, [TAX.fused_query], one[1:], "b"),
        _rec(2, ["Calvanne in 2025", "unknown"], two, "a"),
        _rec(2, ["2025", "unknown"], [reveal(TAX, "2025").as_dict(), two[1]], "b"),
        _rec(2, ["Lyon", "unknown"], None, "c"),
    ]
    c = clarification(records, "all_at_once")
    assert c["over_answer_rate_per_k"] == {"1": {"rate": 0.5, "n": 2}, "2": {"rate": 0.5, "n": 2}}
    assert c["most_of_fused_rate_per_k"] == {"1": {"rate": 0.5, "n": 2}, "2": {"rate": 0, "n": 2}}
    assert c["over_answer_basis"] == {"runs": 4}
    assert c["over_answer_unmeasured"] == 1
    conditions = ["clarify@1", "clarify@2"]
    scored = score_records(records, conditions, [0], "exclude")
    summary = summarize(records, conditions, [0], ["a", "b"], scored, mode="all_at_once")
    text = markdown([("sys", summary)], [], 2, "exclude")
    assert "| over-answer | most of fused query |" in text
    assert "| 1 | 100% of 2 | t1: 100% of 2 | 50% of 2 | 50% of 2 |" in text
    assert (
        "Over-answer pieces found by runs of missing words (a proxy; a lower bound): 4 answers; "
        "1 answers of older records not measured (docs/reading-the-report.md)." in text
    )


def test_each_answer_of_a_run_is_measured(search):
    """A User Answerer that gives the whole fused query whatever is asked: each record keeps
    what each answer reveals, and a two-constraint instance's answers over-answer."""
    (instance,) = [i for i in load_instances(DatasetSource(path="sample")) if i.id == "A-dev-04"]
    ctx, roles = scripted_context(search)
    roles["user_answerer"].script = lambda request: instance.fused_query.rstrip("?")
    record = asyncio.run(run_instance(instance, "clarify@2", 0, ctx))
    assert record.error is None, record.error
    assert [r["revealed"] for r in record.answer_reveals] == [2, 2]
    assert clarification([record])["over_answer_rate_per_k"] == {"2": {"rate": 1.0, "n": 2}}


def test_the_opt_in_cap_keeps_answers_to_a_share_of_the_fused_query():
    fused = TAX.fused_query.rstrip("?")  # 16 units
    capped = SpanLimits(max_share=0.25)  # at most 4 units
    assert is_span("Calvanne in 2025", fused, capped)
    assert not is_span("stays in Calvanne in 2025", fused, capped)
    assert not re.fullmatch(span_regex(fused, capped), fused)
    assert is_span(fused, fused)  # the default stays the study's: no share cap
    assert SpanLimits(max_share=0.01).max_units(16) == 1  # one unit at least
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError):
            SpanLimits(max_share=bad)
    # Set from the experiment config, it reaches the grammar and the re-check.
    options = ClarificationConfig(answer_span=AnswerSpan(max_share=0.25))
    limits = SpanLimits(**options.answer_span.model_dump())
    engine = ScriptedEngine(lambda r: fused)
    with pytest.raises(ConstrainedOutputError):
        asyncio.run(
            user_answerer.answer(
                engine, fused, "Where?", "en", Sampling(max_tokens=64), limits=limits
            )
        )
    assert engine.requests[0].output.pattern == span_regex(fused, capped)
    with pytest.raises(ValueError):
        AnswerSpan(max_share=0)


def test_the_cap_option_keeps_dialogues_saved_before_it_existed():
    """A dialogue is continued only under the same fingerprint: the unset cap must not change
    it (runs started before the option keep their dialogues), a set cap must."""
    roles = {"clarifier": ScriptedEngine(lambda r: "", name="clarifier")}
    sampling = {"clarifier": Sampling(max_tokens=64)}
    before = ClarificationConfig().model_dump(mode="json")
    before["answer_span"].pop("max_share")  # the options as dumped before the cap existed
    parts = {"clarifier": [roles["clarifier"].model, sampling["clarifier"].model_dump(mode="json")]}
    old = hashlib.sha256(json.dumps([parts, before], sort_keys=True).encode()).hexdigest()[:16]
    assert _fingerprint(roles, sampling, ClarificationConfig()) == old
    capped = ClarificationConfig(answer_span=AnswerSpan(max_share=0.5))
    assert _fingerprint(roles, sampling, capped) != old
