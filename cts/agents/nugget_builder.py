"""The golden nugget builder: from the fused query and the evidence a WebDancer run on it showed,
the weighted facts a complete answer contains (golden construction, docs/data-and-golden.md).

Its schema makes every `source_ids` entry one of the evidence ids of that run, so a nugget can
only cite what the trace saw; weights are 3 (essential), 2 (important), 1 (context), the scale
of the shipped benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cts.agents.prompts import render
from cts.serving.engine import ChatModel
from cts.serving.types import ChatRequest, JsonSchemaOutput, RoleSampling, Sampling

NUGGET_MAX_CHARS = 200
WEIGHTS = (3, 2, 1)
#: Most sources one nugget cites.
MAX_SOURCES = 3


@dataclass(frozen=True)
class Evidence:
    """One tool observation of the trace and the evidence ids it showed (corpus doc ids, or
    URLs for web backends)."""

    ids: tuple[str, ...]
    text: str
    #: URL of each id, when known, so the model can match ids to the links in the text.
    urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class NuggetDraft:
    text: str
    weight: int
    source_ids: tuple[str, ...]


def nuggets_schema(evidence_ids: Sequence[str], max_nuggets: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "nuggets": {
                "type": "array",
                "minItems": 1,
                "maxItems": max_nuggets,
                "items": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string", "minLength": 5, "maxLength": NUGGET_MAX_CHARS},
                        "weight": {"enum": list(WEIGHTS)},
                        "source_ids": {
                            "type": "array",
                            "items": {"enum": list(evidence_ids)},
                            "minItems": 1,
                            "maxItems": MAX_SOURCES,
                        },
                    },
                    "required": ["text", "weight", "source_ids"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["nuggets"],
        "additionalProperties": False,
    }


def role_sampling(max_nuggets: int) -> RoleSampling:
    """Room for the longest valid answer of `max_nuggets` nuggets (a small model may spend a
    token per character)."""
    return RoleSampling(max_tokens=64 + max_nuggets * (NUGGET_MAX_CHARS + 40 * MAX_SOURCES) // 2)


def evidence_text(evidence: Sequence[Evidence], max_chars: int) -> str:
    """Every observation, in trace order, each cut to an equal share of `max_chars` so that a
    long early page cannot crowd out later ones."""
    share = max(300, max_chars // max(1, len(evidence)))
    blocks = []
    for e in evidence:
        if len(e.urls) == len(e.ids):
            header = "\n".join(
                f"[{i}]" if i == u else f"[{i}] {u}" for i, u in zip(e.ids, e.urls, strict=True)
            )
        else:
            header = " ".join(f"[{i}]" for i in e.ids)
        body = e.text if len(e.text) <= share else e.text[:share] + " […]"
        blocks.append(f"{header}\n{body}")
    return "\n\n".join(blocks)


async def build_nuggets(
    engine: ChatModel,
    fused_query: str,
    answer: str,
    evidence: Sequence[Evidence],
    language: str,
    sampling: Sampling,
    max_nuggets: int = 8,
    max_evidence_chars: int = 12000,
) -> list[NuggetDraft]:
    """Weighted nuggets citing only the given evidence; duplicates (same text) are dropped."""
    ids = list(dict.fromkeys(i for e in evidence for i in e.ids))
    if not ids:
        raise ValueError("no evidence to cite")
    system, user = render(
        "nugget_builder",
        language,
        fused_query=fused_query,
        answer=answer or "(no answer)",
        evidence=evidence_text(evidence, max_evidence_chars),
        max_nuggets=max_nuggets,
    )
    response = await engine.chat(
        ChatRequest(
            messages=(system, user),
            sampling=sampling,
            output=JsonSchemaOutput(
                name="golden_nuggets", json_schema=nuggets_schema(ids, max_nuggets)
            ),
        )
    )
    drafts: dict[str, NuggetDraft] = {}
    for item in response.parsed["nuggets"]:
        text = " ".join(item["text"].split())
        if not text:
            continue
        drafts.setdefault(
            text.lower(),
            NuggetDraft(text, int(item["weight"]), tuple(dict.fromkeys(item["source_ids"]))),
        )
    return list(drafts.values())
