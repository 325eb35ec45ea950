"""The grounding check: does the evidence a golden nugget cites state it (`support`), part of it
(`partial`) or not (`none`)? Used by `cts golden audit` with the judge role's model.

It reads the cited evidence and at most 10 nuggets that cite it; like the coverage judge, its
output schema is keyed by exactly the nugget ids sent (a missing or invented id is a validation
error, not a verdict) and asks for a short quote of the evidence before each verdict.
Temperature 0 and a fixed seed make verdicts reproducible."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cts.agents.judge import Nugget, keyed_by_nugget
from cts.agents.prompts import render
from cts.serving.engine import ChatModel
from cts.serving.types import ChatRequest, JsonSchemaOutput, RoleSampling, Sampling

BATCH = 10
VERDICTS = ("support", "partial", "none")
QUOTE_MAX_CHARS = 160


@dataclass(frozen=True)
class Grounding:
    verdict: str
    quote: str


def grounding_schema(nugget_ids: Sequence[str]) -> dict[str, Any]:
    return keyed_by_nugget(nugget_ids, ("quote", QUOTE_MAX_CHARS), ("verdict", VERDICTS))


#: Room for a batch of BATCH verdicts with their quotes (a small model may spend a token per
#: character), at temperature 0 with a fixed seed.
SAMPLING = RoleSampling(max_tokens=64 + BATCH * (QUOTE_MAX_CHARS + 40), temperature=0.0, seed=0)


def evidence_block(evidence: Sequence[tuple[str, str]]) -> str:
    """Each cited source as `[id]` over its text, in citation order."""
    return "\n\n".join(f"[{source_id}]\n{text}" for source_id, text in evidence)


async def ground(
    engine: ChatModel,
    evidence: Sequence[tuple[str, str]],
    nuggets: Sequence[Nugget],
    language: str,
    sampling: Sampling,
) -> dict[str, Grounding]:
    """A verdict per nugget (at most BATCH) against `evidence`, (source id, text) pairs."""
    if len(nuggets) > BATCH:
        raise ValueError(f"at most {BATCH} nuggets per grounding call, got {len(nuggets)}")
    system, user = render(
        "grounding",
        language,
        evidence=evidence_block(evidence),
        nuggets="\n".join(f"{n.id}: {n.text}" for n in nuggets),
    )
    response = await engine.chat(
        ChatRequest(
            messages=(system, user),
            sampling=sampling,
            output=JsonSchemaOutput(
                name="nugget_grounding", json_schema=grounding_schema([n.id for n in nuggets])
            ),
        )
    )
    return {
        i: Grounding(verdict=v["verdict"], quote=v["quote"]) for i, v in response.parsed.items()
    }
