"""The loop's signal figures, against hand computations: the reward spread over states, and the
kept questions the User Answerer answered with a removed span."""

from __future__ import annotations

from cts.eval.data.schema import Instance, Record
from cts.train.signal import kept_questions, spread_figures


def test_the_spread_is_the_mean_and_max_over_states_and_counts_those_apart():
    # Spreads 0, 0.5 and 2.5: mean 1.0, max 2.5; apart from a 0.1 tie: 2 of 3.
    assert spread_figures([0.0, 0.5, 2.5], tie=0.1) == {
        "states": 3, "mean": 1.0, "max": 2.5, "apart": 2,
    }  # fmt: skip
    assert spread_figures([], tie=0.1) == {"states": 0, "mean": None, "max": None, "apart": 0}


def _instance(id_: str, spans: list[str]) -> Instance:
    removed = [{"type": "time", "span": s} for s in spans]
    fused = "Which phones launched in 2023?" if spans else "Which phones launched?"
    row = {"id": id_, "blurred_query": "Which phones launched?", "fused_query": fused}
    return Instance.model_validate({**row, "removed_constraints": removed})


def _record(id_: str, seed: int, questions: list[str], answers: list[str]) -> Record:
    return Record(
        instance_id=id_, condition="clarify@2", seed=seed, questions=questions, answers=answers
    )


def test_a_kept_question_is_about_a_removed_constraint_when_an_answer_holds_its_span():
    instances = {"a": _instance("a", ["2023"]), "b": _instance("b", [])}
    records = [
        _record("a", 0, ["Which year?", "Which  brand?"], ["In 2023", "unknown"]),
        _record("a", 1, ["Which brand?"], ["unknown"]),
        _record("b", 0, ["Which year?"], ["2024"]),
    ]
    kept = [
        ("a", 1, "Which year?"),  # answered, and the answer holds the span: about
        ("a", 2, "Which brand?"),  # asked second in seed 0 and answered unknown: neither
        ("a", 1, "Which brand?"),  # first in seed 1, unknown
        ("b", 1, "Which year?"),  # answered; no spans recorded: not counted for `about`
    ]
    assert kept_questions(kept, records, instances) == {
        "n": 4, "answered": 2, "with_spans": 3, "about_removed": 1,
    }  # fmt: skip
