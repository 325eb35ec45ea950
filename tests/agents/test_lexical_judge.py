"""The lexical judge (cts/agents/lexical_judge.py, engine `lexical`): its rules worked by hand on
small answers, its place in the judge role (and nowhere else), and its agreement with the
shipped human labels held above a floor recorded from its one measurement (a regression
guard, not a tuned number)."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from cts.agents import judge, lexical_judge
from cts.agents.lexical_judge import Match, match, terms
from cts.cli import app
from cts.eval.run.config import load_experiment
from cts.foundation.yaml_config import ConfigError
from cts.serving.errors import EngineError
from cts.serving.lexical import LexicalEngine, is_lexical
from cts.serving.types import ChatRequest, Message

NUGGET = "The Ferrow Lumen 65 has a list price of €1,899 and a refresh rate of up to 144 Hz."


def test_terms_are_cut_words_outside_the_stop_list_chinese_words_and_kana_hangul_pairs():
    assert terms("The charging case charges quickly") == {"charg", "case", "quick"}
    assert terms("续航时间") == {"续航", "时间"}  # jieba's words, not pairs across them
    # Every alphabet has terms, and a short word is one: none of these nuggets is termless.
    assert terms("AI is on") == {"ai"}
    assert terms("Стоимость билета") == {"стоим", "билет"}
    assert terms("カタカナ") == {"カタ", "タカ", "カナ"}
    assert terms("한국어") == {"한국", "국어"}


def test_a_number_glued_to_letters_is_a_name_unless_the_letters_are_a_unit():
    assert lexical_judge.numbers("5G and A380 in Q3") == set()
    assert terms("5G and A380 in Q3") == {"5g", "a380", "q3"}
    assert lexical_judge.numbers("30km in 7.5h, 100mAh, v3.2.1") == {30.0, 7.5, 100.0, "3.2.1"}
    assert lexical_judge.label("We have 5 apples.", "The phone supports 5G.")[0] == "none"
    # A thousands separator before a Chinese character is one (3,860吨 is 3860, not 3.86).
    assert lexical_judge.numbers("产量约3,860吨") == {3860.0}


FUSED = "Which restaurants hold three stars in the 2025 Gildbrook Guide?"


def test_what_the_question_already_says_earns_nothing():
    """A nugget whose only number is the removed year was `full` from the fused query alone;
    the question's words and numbers are no evidence, so restating it earns nothing, and the
    names it adds earn the nugget."""
    nugget = (
        "Two restaurants hold three stars in the 2025 Gildbrook Guide: Halden Table and Saltgrass."
    )
    assert lexical_judge.label(FUSED, nugget, FUSED) == ("none", "none")
    assert lexical_judge.label(FUSED, nugget)[0] == "full"  # without the discount: earned
    found = "Two restaurants hold three stars in the 2025 guide: Halden Table and Saltgrass."
    assert lexical_judge.label(found, nugget, FUSED)[0] == "full"
    assert lexical_judge.own_parts(nugget, FUSED) == [
        ("t", "two"), ("t", "halde"), ("t", "table"), ("t", "saltg")
    ]  # fmt: skip


def test_word_salad_is_not_a_statement():
    """The nugget's words shuffled: each word is in the answer, none in its place."""
    nugget = (
        "The Korvex Aura Pro earbuds play for about 7.5 hours per charge with noise cancelling on."
    )
    assert lexical_judge.label(nugget, nugget)[0] == "full"
    salad = "cancelling hours Pro earbuds noise charge Korvex per The with play 7.5 about Aura on."
    assert lexical_judge.label(salad, nugget)[0] == "none"
    # A rewording keeps the parts in their place, and some words may change around them.
    reworded = "Korvex's Aura Pro earbuds last up to 7.5 hours per charge with noise cancelling."
    assert lexical_judge.label(reworded, nugget)[0] == "full"


def test_a_nugget_with_nothing_beyond_the_question_is_refused():
    with pytest.raises(lexical_judge.UnjudgeableNugget, match="no word or number"):
        lexical_judge.label("Yes, it does.", "No.")
    with pytest.raises(lexical_judge.UnjudgeableNugget, match="nothing beyond the question"):
        lexical_judge.label("anything", "The 2025 Gildbrook Guide.", FUSED)


def test_every_number_and_half_the_terms_make_full():
    answer = "The Ferrow Lumen 65 lists at a price of 1899 euros and refreshes at 144 Hz."
    got = match(answer, NUGGET)
    # numbers 65, 1899, 144 all stated in place; terms ferro lumen list price refre rate hz:
    # 5 of 7 said ("lists" is cut to another stem, and "rate" is missing)
    assert (got.stated, got.near, got.has_numbers) == (1.0, 1.0, True)
    assert got.recall == pytest.approx(5 / 7)
    assert lexical_judge.label(answer, NUGGET)[0] == "full"
    # What the rules cannot tell from salad: a value moved away from every word that stood
    # beside it, with those words still elsewhere in the answer, is not counted as stated.
    moved = "At 1899 euros, the Ferrow Lumen 65 refreshes at 144 Hz with a list price to match."
    assert match(moved, NUGGET).stated == pytest.approx(2 / 3)
    assert lexical_judge.label(moved, NUGGET)[0] == "partial"


def test_a_rounded_price_is_partial_and_every_number_wrong_is_none():
    rounded = "The Ferrow Lumen 65 lists at about €1,900 and refreshes at up to 120 Hz."
    assert lexical_judge.label(rounded, NUGGET)[0] == "partial"  # 65 and 1900 (0.05%) near
    wrong = "The Ferrow Lumen 45 lists at €2,499 with a refresh rate of 30 Hz."
    assert match(wrong, NUGGET).near == 0.0
    assert lexical_judge.label(wrong, NUGGET) == ("none", "none")


def test_a_year_is_near_only_as_itself():
    nugget = "The museum reopened in 2021."
    assert lexical_judge.label("The museum reopened in 2022.", nugget)[0] == "none"
    assert lexical_judge.label("The museum reopened in 2021.", nugget)[0] == "full"


def test_a_value_offered_as_a_guess_is_partial_and_the_evidence_is_its_sentence():
    nugget = "The dose is one tablet every 48 hours."
    answer = "Take it with water. It may be one tablet every 48 hours, I could not confirm."
    assert lexical_judge.label(answer, nugget) == (
        "partial",
        "It may be one tablet every 48 hours, I could not confirm.",
    )


def test_nuggets_without_numbers_go_by_their_terms_alone():
    nugget = "Registration requires proof of rabies vaccination and a microchip."
    assert Match(1.0, 1.0, 0.0, False, own_recall=0.6).label == "full"
    assert Match(1.0, 1.0, 0.0, False, own_recall=0.3).label == "partial"
    assert Match(1.0, 1.0, 1.0, False, own_recall=0.29).label == "none"
    said = "You need proof of a rabies vaccination and a microchip to register."
    assert lexical_judge.label(said, nugget)[0] == "full"
    assert lexical_judge.label("", nugget) == ("none", "none")


def test_chinese_numbers_in_full_width_count_and_an_answer_in_another_language_does_not():
    nugget = "该品种亩产约652公斤。"
    assert lexical_judge.label("该品种的亩产约为６５２公斤。", nugget)[0] == "full"
    # The limit it names: an English answer shares no term with a Chinese nugget.
    assert match("The yield is 1,234 kg.", "产量为1234公斤") == Match(1.0, 1.0, 0.0, True, 0.0)
    assert lexical_judge.label("The yield is 1,234 kg.", "产量为1234公斤")[0] == "none"


def test_dotted_sequences_are_stated_as_written_and_comma_lists_are_their_numbers():
    # A version, a date and an address are no decimal: each is one value, as written.
    assert lexical_judge.numbers("v3.2.1 on 15.03.2024 at 192.168.0.1") == {
        "3.2.1",
        "15.03.2024",
        "192.168.0.1",
    }
    # More than one comma: a list; one separator stays a decimal (7.5 = 7,5).
    assert lexical_judge.numbers("sizes 5,6,7; 7,5 or 7.5 hours") == {5.0, 6.0, 7.0, 7.5}
    nugget = "Firmware 3.2.1 was released on 15.03.2024."
    said = "Firmware 3.2.1 (released 15.03.2024) adds 7.5 hours per charge."
    assert lexical_judge.label(said, nugget)[0] == "full"
    # Another version is neither stated nor near (no 15% around a sequence): terms alone
    # cannot lift a nugget whose every value is missed.
    assert match("Firmware 3.2.2 was released on 15.03.2024.", nugget).stated == 0.5
    assert match("Firmware 3.2.2 was released on 15.03.2024.", nugget).near == 0.5
    # A plain number near a sequence's first part is not near the sequence.
    assert match("Version 3 was released.", "Version 3.2.1 was released.").near == 0.0
    assert lexical_judge.label("Sizes 5, 6 and 7 are stocked.", "Stocked in sizes 5,6,7.")[0] == (
        "full"
    )


def test_the_judge_role_labels_through_any_wrapper_and_the_engine_answers_no_chat():
    class Outer:  # a wrapper, as the cache and the metering are
        def __init__(self, inner):
            self.inner = inner
            self.stats = getattr(inner, "stats", None)

    engine = LexicalEngine("lexical-judge")
    assert is_lexical(Outer(Outer(engine))) and not is_lexical(Outer(object()))

    class N:
        def __init__(self, id: str, text: str) -> None:
            self.id, self.text = id, text

    got = asyncio.run(
        judge.judge(Outer(engine), "It costs €1,899.", [N("n1", "It costs €1,899.")], "en", None)
    )
    assert (got["n1"].label, got["n1"].evidence) == ("full", "It costs €1,899.")
    assert engine.stats.calls == 0  # no model was called
    with pytest.raises(EngineError, match="labels nuggets for the judge role only"):
        asyncio.run(engine.chat(ChatRequest(messages=(Message(role="user", content="hi"),))))


def test_a_role_other_than_the_judge_on_the_lexical_engine_is_refused():
    load_experiment(None, ["roles.judge.model=lexical-judge"])  # the judge: fine
    with pytest.raises(ConfigError, match="role clarifier needs a language model"):
        load_experiment(None, ["roles.clarifier.model=lexical-judge"])


#: κ on the shipped labels: 0.512 (n 118) under the first rules; 0.526 (en 0.573, zh 0.425)
#: since the question's words were discounted and a statement's parts had to stand in place
#: (docs/calibration-and-rejudging.md says how those rules were chosen).
KAPPA_FLOOR = 0.45


def test_cts_judge_calibrate_on_the_shipped_labels_stays_above_its_floor(tmp_path):
    out = tmp_path / "calibration.json"
    result = CliRunner().invoke(
        app,
        [
            "judge", "calibrate", "--labels", "sample", "--out", str(out),
            "--set", "roles.judge.model=lexical-judge",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    print(json.dumps(figures)[:400])
    assert (figures["pairs"], figures["agreement"]["n"]) == (118, 118)
    assert figures["agreement"]["kappa"] >= KAPPA_FLOOR
    assert figures["order_flip"]["changed"] == 0 and figures["rerun"]["changed"] == 0


def test_on_the_sample_restating_the_question_earns_what_the_blurred_one_does():
    """The 72 sample instances: the fused query as the answer scored 15.0 against 5.3 for the
    blurred one (an "oracle gain" with no search) before the question's words were discounted;
    each nugget stated as written still earns it."""
    from statistics import mean

    from cts.eval.data.dataset import DatasetSource, load_instances
    from cts.eval.score.metrics import restore_score

    def score(instance, answer: str) -> float:
        nuggets = instance.golden.nuggets
        labels = {
            n.id: lexical_judge.label(answer, n.text, instance.fused_query)[0] for n in nuggets
        }
        return restore_score(labels, {n.id: n.weight for n in nuggets})

    every = [
        i for split in ("train", "dev", "test")
        for i in load_instances(DatasetSource(path="sample", split=split))
    ]  # fmt: skip
    assert len(every) == 72
    fused = mean(score(i, i.fused_query) for i in every)
    blurred = mean(score(i, i.blurred_query) for i in every)
    assert abs(fused - blurred) <= 2.0
    stated = mean(score(i, " ".join(n.text for n in i.golden.nuggets)) for i in every)
    assert stated >= 95.0


def test_a_run_with_the_lexical_judge_refuses_a_nugget_it_cannot_judge(tmp_path):
    from cts.eval.data.dataset import DatasetError
    from cts.eval.experiment import instances_for

    row = {
        "id": "q1", "blurred_query": "Is the museum open?",
        "fused_query": "Is the Penhallow museum open on Mondays?",
        "golden": {"nuggets": [
            {"id": "n1", "text": "No.", "weight": 1, "source_ids": []},
            {"id": "n2", "text": "The Penhallow museum is open on Mondays?", "weight": 1,
             "source_ids": []},
            {"id": "n3", "text": "It closes on Mondays in winter.", "weight": 1, "source_ids": []},
        ]},
    }  # fmt: skip
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(row) + "\n")
    resolved = load_experiment(None, [f"dataset.path={data}", "dataset.split=null"])
    with pytest.raises(DatasetError) as refused:
        instances_for(resolved, ["blurred"])
    problems = [str(p) for p in refused.value.problems]
    assert len(problems) == 2
    assert "instance q1, nugget n1" in problems[0] and "no word or number" in problems[0]
    assert "nugget n2" in problems[1] and "nothing beyond the question" in problems[1]
    # An LLM judge reads meaning: the same dataset runs.
    llm = load_experiment(None, [f"dataset.path={data}", "dataset.split=null",
                                 "roles.judge.model=smollm2-135m-instruct"])  # fmt: skip
    assert [i.id for i in instances_for(llm, ["blurred"])[1]] == ["q1"]
