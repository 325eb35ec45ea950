"""The coverage judge: labels every nugget full / partial / none against a final answer.

At most 10 nuggets per call; the output schema is keyed by exactly the nugget ids sent (so a
missing or invented id is a validation error, not a score) and asks for a short evidence
quote before each label. Temperature 0 and a fixed seed (`SAMPLING`, over whatever the model's
defaults and the config say) make labels reproducible. As in the study, the judge sees the
answer and the nuggets only; `query` (the fused query) is shown only when one is given.

A judge may favour a nugget for where it stands in the listing; `shuffled` gives a batch's
nuggets an order that depends only on a key (the record's), so that such a bias spreads over
the nuggets instead of always landing on the first ones, and the same key always gives the
same order. Labels come back keyed by nugget id, so the order never decides whose label is
whose."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from cts.agents import lexical_judge
from cts.agents.prompts import prompt_language, render
from cts.serving.engine import ChatModel
from cts.serving.lexical import is_lexical
from cts.serving.types import ChatRequest, JsonSchemaOutput, RoleSampling, Sampling

#: Most nuggets one judge call labels (`judge.batch_size` may lower it, never raise it).
BATCH = 10


class Nugget(Protocol):
    """What the judge reads of a golden nugget (cts.eval.data.schema.Nugget fits)."""

    @property
    def id(self) -> str: ...

    @property
    def text(self) -> str: ...


N = TypeVar("N", bound=Nugget)


def shuffled(nuggets: Sequence[N], key: str) -> list[N]:
    """`nuggets` in an order fixed by `key`: sorted by SHA-256 of key and nugget id. Unlike
    Python's hash() or `random`, it is the same in every process, machine and version."""

    def rank(nugget: N) -> bytes:
        return hashlib.sha256(f"{key}\x1f{nugget.id}".encode()).digest()

    return sorted(nuggets, key=rank)


LABELS = ("full", "partial", "none")

#: The answer-independence canary's `unrelated` answer per prompt language: text that states
#: no fact a search benchmark's nugget asks for, so every nugget is `none` against it.
UNRELATED_ANSWERS = {
    "en": "Preheat the oven to 180 degrees, whisk two eggs with sugar and flour, pour the "
    "batter into a buttered tin and bake it for twenty-five minutes.",
    "zh": "将烤箱预热到180度，把两个鸡蛋与糖和面粉搅匀，倒入抹了黄油的模具，烘烤二十五分钟。",
}


#: The answers the canary may judge a record's nuggets against (cts.eval.run.config.JudgeCanary):
#: none, a fixed unrelated text, another instance's nuggets, the instance's fused query.
CANARY_ANSWERS = ("empty", "unrelated", "other", "restated")


def canary_answer(kind: str, language: str, fused_query: str = "", other: str = "") -> str:
    """The answer the canary judges nuggets against: "" for `empty` (shown as "(no answer)");
    the unrelated text in the instance's prompt language for `unrelated` (and for `other` when
    there is no other instance); `other`, the nuggets of another instance of the dataset in
    the same language, stated as written (facts, only not these); `restated`, the fused query
    itself, which states what the user asked and no fact that answers it."""
    if kind == "empty":
        return ""
    if kind == "restated":
        return fused_query
    if kind == "other" and other:
        return other
    return UNRELATED_ANSWERS[prompt_language(language)]


def other_answers(instances: Sequence[Any]) -> dict[str, str]:
    """Per instance id, the `other` canary answer: the nuggets of the next instance (by id,
    round) of the same prompt language that has nuggets; none where it is alone."""
    groups: dict[str, list[Any]] = {}
    for i in sorted(instances, key=lambda i: i.id):
        if i.golden is not None and i.golden.nuggets:
            groups.setdefault(prompt_language(i.language), []).append(i)
    found = {}
    for group in groups.values():
        for k, instance in enumerate(group):
            other = group[(k + 1) % len(group)]
            if other is not instance:
                found[instance.id] = " ".join(n.text for n in other.golden.nuggets)
    return found


@dataclass(frozen=True)
class NuggetLabel:
    label: str
    evidence: str


def judge_schema(nugget_ids: Sequence[str]) -> dict[str, Any]:
    return keyed_by_nugget(nugget_ids, ("evidence", 120), ("label", LABELS))


def keyed_by_nugget(
    nugget_ids: Sequence[str], quote: tuple[str, int], verdict: tuple[str, Sequence[str]]
) -> dict[str, Any]:
    """An object with exactly the nugget ids sent as keys, each a short quote (field name, at
    most so many characters) before its verdict (field name, the allowed values): a missing
    or invented id is a validation error, never a verdict."""
    (quote_field, quote_max), (verdict_field, verdicts) = quote, verdict
    entry = {
        "type": "object",
        "properties": {
            quote_field: {"type": "string", "maxLength": quote_max},
            verdict_field: {"enum": list(verdicts)},
        },
        "required": [quote_field, verdict_field],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": dict.fromkeys(nugget_ids, entry),
        "required": list(nugget_ids),
        "additionalProperties": False,
    }


#: Room for a batch of BATCH labels with their evidence quotes.
SAMPLING = RoleSampling(max_tokens=1024, temperature=0.0, seed=0)


async def _batch(
    engine: ChatModel,
    query: str | None,
    answer: str,
    nuggets: Sequence[Nugget],
    language: str,
    sampling: Sampling,
) -> dict[str, NuggetLabel]:
    listing = "\n".join(f"{n.id}: {n.text}" for n in nuggets)
    system, user = render(
        "judge",
        language,
        "user" if query is None else "user_with_query",
        query=query,
        answer=answer or "(no answer)",
        nuggets=listing,
    )
    ids = [n.id for n in nuggets]
    response = await engine.chat(
        ChatRequest(
            messages=(system, user),
            sampling=sampling,
            output=JsonSchemaOutput(name="nugget_labels", json_schema=judge_schema(ids)),
        )
    )
    return {
        i: NuggetLabel(label=v["label"], evidence=v["evidence"]) for i, v in response.parsed.items()
    }


async def judge(
    engine: ChatModel,
    answer: str,
    nuggets: Sequence[Nugget],
    language: str,
    sampling: Sampling,
    query: str | None = None,
    batch_size: int = BATCH,
    asked: str = "",
) -> dict[str, NuggetLabel]:
    """Labels for every nugget, in the order given, in batches of `batch_size` (at most 10);
    `query` is shown only if given. A lexical engine (cts/serving/lexical.py) is no model:
    cts/agents/lexical_judge.py labels the nuggets, reading neither `query` nor the language but
    `asked` (the fused query, given whether or not the judge is shown it), whose words and
    numbers it counts as no evidence; an LLM judge never reads `asked`."""
    if not 1 <= batch_size <= BATCH:
        raise ValueError(f"batch_size must be 1..{BATCH}, got {batch_size}")
    if is_lexical(engine):  # no model to ask, and no model call to count
        return {n.id: NuggetLabel(*lexical_judge.label(answer, n.text, asked)) for n in nuggets}
    batches = [nuggets[i : i + batch_size] for i in range(0, len(nuggets), batch_size)]
    labelled: dict[str, NuggetLabel] = {}
    for part in await asyncio.gather(
        *(_batch(engine, query, answer, b, language, sampling) for b in batches)
    ):
        labelled.update(part)
    return labelled
