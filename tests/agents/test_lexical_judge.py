"""The lexical judge (agents/lexical_judge.py, engine `lexical`): its rules worked by hand on
small answers, its place in the judge role (and nowhere else), and its agreement with the
shipped human labels held above a floor recorded from its one measurement (a regression
guard, not a tuned number)."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from agents import judge, lexical_judge
from agents.lexical_judge import Match, match, terms
from cts.cli import app
from eval.run.config import load_experiment
from serving.errors import EngineError
from serving.lexical import LexicalEngine, is_lexical
from serving.types import ChatRequest, Message
from serving.yaml_config import ConfigError

NUGGET = "The Ferrow Lumen 65 has a list price of €1,899 and a refresh rate of up to 144 Hz."


def test_terms_are_cut_words_outside_the_stop_list_and_chinese_character_pairs():
    assert terms("The charging case charges quickly") == {"charg", "case", "quick"}
    assert terms("续航时间") == {"续航", "航时", "时间"}


def test_every_number_and_half_the_terms_make_full():
    answer = "At 1899 euros, the Ferrow Lumen 65 refreshes at 144 Hz with a list price to match."
    got = match(answer, NUGGET)
    # numbers 65, 1899, 144 all stated; terms ferro lumen list price refre rate: 5 of 6 said
    assert (got.stated, got.near, got.has_numbers) == (1.0, 1.0, True)
    assert got.recall == pytest.approx(5 / 6)
    assert lexical_judge.label(answer, NUGGET)[0] == "full"


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
    assert Match(1.0, 1.0, 0.6, False).label == "full"
    assert Match(1.0, 1.0, 0.3, False).label == "partial"
    assert Match(1.0, 1.0, 0.29, False).label == "none"
    said = "You need proof of a rabies vaccination and a microchip to register."
    assert lexical_judge.label(said, nugget)[0] == "full"
    assert lexical_judge.label("", nugget) == ("none", "none")


def test_chinese_numbers_in_full_width_count_and_an_answer_in_another_language_does_not():
    nugget = "该品种亩产约652公斤。"
    assert lexical_judge.label("该品种的亩产约为６５２公斤。", nugget)[0] == "full"
    # The limit it names: an English answer shares no term with a Chinese nugget.
    assert match("The yield is 1,234 kg.", "产量为1234公斤") == Match(1.0, 1.0, 0.0, True)
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


#: κ measured once on the shipped labels when the rules were fixed: 0.512 (n 118).
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
