"""Blurrer calls for fine-tuning the tiny Blurrer, from the train split only.

The tiny model, asked to blur, returns the fused query with the span still in it, or another
query. What it learns here is a careful *deleting* blurrer: the chosen constraints' spans taken
out of the fused query with a function word that only served them ("in 2023", "在2025年"),
nothing else changed (`blur_by_rule`). The fused queries are those a Fuser gives (the train
split's fused questions, and the tiny Fuser's copies of keyword sessions, cts/train/fuser_data.py);
for a train instance's own fused question and removed constraint the completion is the
dataset's blurred query. Every example passes the rules `cts data blur` checks a row against
(cts/eval/construct/checks.py: the span is gone, nothing dangles, the query is still three words and
mostly the fused query's); one that does not is not written. Everything is drawn from one
`random.Random(seed)`: the same seed gives the same examples, in the same order.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from cts.agents.blurrer import Blurred, constraint_list
from cts.agents.fuser import StatedConstraint
from cts.agents.prompts import render
from cts.eval.construct.checks import EN_FUNCTION, question_rejections, span_rejections
from cts.train.answerer_data import Instance, read_instances
from cts.train.fuser_data import intent_of, session
from cts.train.sft import RoleCall, as_json, chat, in_turn

#: Share of examples on a train instance's own fused question and removed constraint.
DATASET_SHARE = 0.3
#: Share of examples that remove two constraints (where the query states two).
TWO_SHARE = 0.2


def blur_by_rule(query: str, spans: Sequence[str]) -> str:
    """`query` without `spans`, each taken with the function word before it ("in", "在"),
    spaces and punctuation left tidy."""
    text = query
    for span in spans:
        at = text.find(span)
        if at < 0:
            continue
        before = text[:at].rstrip()
        words = before.split()
        if words and words[-1].lower() in EN_FUNCTION and words[-1].lower() not in ("the", "a"):
            before = before[: len(before) - len(words[-1])].rstrip()
        elif before[-1:] in ("在", "于"):
            before = before[:-1]
        text = f"{before} {text[at + len(span) :].lstrip()}"
    text = " ".join(text.split())
    text = re.sub(r"\s+([,，.。?？!！;；:：])", r"\1", text)
    text = re.sub(r"([,，、])\s*(?=[,，?？.。])", "", text)
    return re.sub(r"(?<=[\u3400-\u9fff]) (?=[\u3400-\u9fff])", "", text).strip()


@dataclass(frozen=True)
class BlurrerExample(RoleCall):
    """One Blurrer call: its chat messages (system, user) and the completion (JSON)."""

    #: `dataset` (the train instance's own blurred query) or `rule`.
    label: str
    fused_query: str
    removed: list[StatedConstraint]


def _draw(instance: Instance, rng: random.Random) -> tuple[str, str, list[StatedConstraint]]:
    """A fused query, its blurred query and the constraints removed."""
    if instance.constraints and rng.random() < DATASET_SHARE:
        removed = [StatedConstraint(type=c.type, span=c.span) for c in instance.constraints]
        return "dataset", instance.fused_query, removed
    query, stated = intent_of(session(instance, rng), instance)
    count = 2 if len(stated) > 1 and rng.random() < TWO_SHARE else 1
    return "rule", query, rng.sample(stated, min(count, len(stated)))


def blurrer_example(instance: Instance, rng: random.Random) -> BlurrerExample | None:
    """One Blurrer call on `instance`, or None where the drawn query states nothing to remove
    or its blurring fails the checks."""
    source, fused, removed = _draw(instance, rng)
    if not removed:
        return None
    blurred = (
        instance.blurred_query
        if source == "dataset"
        else blur_by_rule(fused, [c.span for c in removed])
    )
    if span_rejections(fused, blurred, removed) or question_rejections(fused, blurred, removed):
        return None
    # The prompt lists the constraints to remove in the fused query's order.
    targets = sorted(removed, key=lambda c: fused.find(c.span))
    system, user = render(
        "blurrer", instance.language, fused_query=fused, constraints=constraint_list(targets)
    )
    return BlurrerExample(
        instance_id=instance.id,
        language=instance.language,
        label=source,
        fused_query=fused,
        removed=targets,
        completion=as_json(Blurred(blurred_query=blurred, removed=targets)),
        messages=chat(system, user),
    )


def generate(count: int, seed: int) -> list[BlurrerExample]:
    """`count` Blurrer calls drawn with `seed` from the train split's instances in turn."""
    return in_turn(read_instances(), count, seed, blurrer_example)


def label_counts(examples: Sequence[BlurrerExample]) -> dict[str, int]:
    """Examples whose completion is the dataset's blurred query, and those blurred by rule."""
    return dict(sorted(Counter(e.label for e in examples).items()))


def removed_counts(examples: Sequence[BlurrerExample]) -> dict[str, int]:
    """How many removed constraints of each type the completions list."""
    return dict(sorted(Counter(c.type for e in examples for c in e.removed).items()))


def check_completion(example: BlurrerExample) -> None:
    """Raise if the completion is not what the role's schema admits or fails a check."""
    found = Blurred.model_validate_json(example.completion)
    rejected = span_rejections(example.fused_query, found.blurred_query, found.removed)
    rejected += question_rejections(example.fused_query, found.blurred_query, found.removed)
    if rejected:
        raise ValueError(f"{example.instance_id}: {rejected}")
