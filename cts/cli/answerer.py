"""`cts answerer …`: how far to trust the simulated user — the User Answerer against a careful
person's answers."""

from __future__ import annotations

from pathlib import Path

import typer

from cts.cli.common import command, command_group, role_experiment, write_figures
from cts.cli.options import CONFIG_OPTION, ENDPOINTS_OPTION, SET_OPTION, labels_option
from cts.eval.audit.answerer_calibration import calibrate_experiment, read_answer_labels, render

app = command_group(
    "Trust the simulated user: the User Answerer against a careful person's answers."
)


@command(app, "calibrate")
def calibrate(
    labels: str = labels_option(
        "Labelled JSONL, one {fused_query, question, expected} per line (`expected`: the "
        "value copied from the fused query, or `unknown`; optional id, language, "
        "constraint_type, blurred_query, removed_constraints (with spans: an answer revealing "
        "another removed span over-discloses), instance_id, note); `sample`: the set shipped "
        "with the toolkit."
    ),
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    out: Path | None = typer.Option(
        None, help="Also write the figures and every answer as JSON here."
    ),
    cases: int = typer.Option(40, help="List at most this many cases."),
    endpoints: Path | None = ENDPOINTS_OPTION,
) -> None:
    """The simulated user against a careful person's answers.

    The experiment's User Answerer (its model, sampling and clarification.answerer /
    answer_span options, as `cts run` calls it, seeded with the first seed, response cache
    off) answers every labelled question once. Printed, each with its n: exact and
    containment match (normalised: case, whitespace, punctuation, full-/half-width); the
    false-unknown rate (`unknown` where a value was expected); the false-answer rate (a value
    where `unknown` was expected); the over-disclosure rate (a value answer that gives a
    number, proper noun, quoted span or other labelled value of the fused query that the
    expected answer, the question and the blurred query do not hold); all of them per
    language and per constraint type; then the cases to look at."""
    labelled = read_answer_labels(labels)  # a bad row is named before any model loads
    resolved, name = role_experiment(config, set_, endpoints, "user_answerer")
    result = calibrate_experiment(resolved, labelled)
    typer.echo(render(result, name, cases))
    write_figures(out, "user_answerer", name, result.as_dict())
