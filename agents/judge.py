"""The coverage judge: labels every nugget full / partial / none against a final answer.

At most 10 nuggets per call; the output schema is keyed by exactly the nugget ids sent (so a
missing or invented id is a validation error, not a score) and asks for a short evidence
quote before each label. Temperature 0 and a fixed seed (`SAMPLING`, over whatever the model's
defaults and the config say) make labels reproducible. As in the study, the judge sees the
answer and the nuggets only; `query` (the fused query) is shown only when one is given."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agents.prompts import render
from serving.engine import ChatModel
from serving.types import ChatRequest, JsonSchemaOutput, RoleSampling, Sampling

BATCH = 10


class Nugget(Protocol):
    """What the judge reads of a golden nugget (eval.schema.Nugget fits)."""

    id: str
    text: str


LABELS = ("full", "partial", "none")


@dataclass(frozen=True)
class NuggetLabel:
    label: str
    evidence: str


def judge_schema(nugget_ids: list[str]) -> dict[str, Any]:
    entry = {
        "type": "object",
        "properties": {
            "evidence": {"type": "string", "maxLength": 120},
            "label": {"enum": list(LABELS)},
        },
        "required": ["evidence", "label"],
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
) -> dict[str, NuggetLabel]:
    """Labels for every nugget, in batches of at most 10; `query` is shown only if given."""
    batches = [nuggets[i : i + BATCH] for i in range(0, len(nuggets), BATCH)]
    labelled: dict[str, NuggetLabel] = {}
    for part in await asyncio.gather(
        *(_batch(engine, query, answer, b, language, sampling) for b in batches)
    ):
        labelled.update(part)
    return labelled
