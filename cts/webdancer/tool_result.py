"""What a tool call returns: the text the agent reads, and what it showed (for traces, evidence
and the tool cache). `visit` builds one directly (cts/webdancer/visit.py); `search` and the tool
cache's replays in cts/webdancer/tools.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict


class _Stored(BaseModel):
    """What the tool cache holds of a result (ToolResult.as_dict)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str
    doc_ids: list[str]
    urls: list[str]
    errors: dict[str, str]
    evidence: list[dict[str, str]]


@dataclass
class ToolResult:
    text: str
    #: Corpus documents and URLs the result showed the model (for traces and evidence).
    doc_ids: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    #: Why a query or a URL failed, by that query or URL.
    errors: dict[str, str] = field(default_factory=dict)
    #: What the text actually shows, as {id, url}: each search hit, each page read (not a
    #: failed visit); id is the corpus doc id, or the URL when there is none (web search).
    #: Golden nuggets may cite only these.
    evidence: list[dict[str, str]] = field(default_factory=list)
    cached: bool = False

    @classmethod
    def stored(cls, row: str) -> ToolResult:
        """A tool-cache row as a replayed result; ValidationError for a row that is not one
        (an entry from before results carried their evidence included)."""
        return cls(**_Stored.model_validate_json(row).model_dump(), cached=True)

    def as_dict(self) -> dict[str, Any]:
        """What a trace and the tool cache keep: all but whether it was replayed."""
        return {k: v for k, v in vars(self).items() if k != "cached"}
