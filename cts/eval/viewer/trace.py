"""A search run's trace as a sample shows it, turn by turn: each model call (its reasoning, and
the tool call or answer it made) with the observation that answered it, the search and visit
tools' texts read back into queries, hits and pages. Apart because it follows the agent's
protocol and the tools' rendered texts (cts/webdancer/), which change without the rest of the
viewer; every text is read cut (cts/eval/viewer/cuts.py) and in one pass.
"""

from __future__ import annotations

import re
from typing import Any

from cts.eval.viewer.cuts import Cuts
from cts.webdancer.protocol import FinalAnswer, ProtocolError, ToolCall, parse_turn
from cts.webdancer.search import QUERY_SEPARATOR

_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)
_TOOL_CALL_TEXT = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
# The tool texts are read with str methods and anchored patterns that cannot backtrack: a
# search over a runaway page, or a line of "](" a million times, costs one pass.
_SEARCH_HEAD = "A Google search for '"
_SEARCH_COUNT = re.compile(r"\d+ results:")
_HIT_START = re.compile(r"(\d+)\. \[")
_PAGE_PARTS = (
    "The useful information in ",
    " for user goal ",
    " as follows: \n\nEvidence in page: \n",
    "\n\nSummary: \n",
)


def model_turn(step: dict[str, Any]) -> dict[str, Any]:
    """One model call of a search run: its reasoning, and the tool call or answer it made."""
    text = str(step.get("text", ""))
    think = _THINK.search(text)
    parsed = parse_turn(text)
    turn: dict[str, Any] = {
        "reasoning": think.group(1).strip() if think else "",
        "text": text,
        "final": bool(step.get("final")),
        "cached": bool(step.get("cached")),
        "prompt_tokens": step.get("prompt_tokens"),
        "completion_tokens": step.get("completion_tokens"),
        "tool_call": None,
        "answer": None,
        "protocol_error": None,
    }
    if isinstance(parsed, ToolCall):
        turn["tool_call"] = {"name": parsed.name, "arguments": parsed.arguments}
    elif isinstance(parsed, FinalAnswer):
        turn["answer"] = parsed.text
    elif isinstance(parsed, ProtocolError):
        raw = _TOOL_CALL_TEXT.search(text)
        turn["protocol_error"] = {"message": parsed.message, "raw": raw.group(1) if raw else ""}
    return turn


def _search_query(block: str) -> str | None:
    """The query of `A Google search for '<query>' found N results:` on the block's first
    line."""
    line = block.lstrip("\n").partition("\n")[0]
    if not line.startswith(_SEARCH_HEAD):
        return None
    query, found, rest = line[len(_SEARCH_HEAD) :].rpartition("' found ")
    return query if found and _SEARCH_COUNT.match(rest) else None


def _hit_head(line: str) -> tuple[int, str, str] | None:
    """`N. [title](url)` as (rank, title, url): the url is after the last `](` and holds no
    white space."""
    start = _HIT_START.match(line)
    if start is None or not line.endswith(")"):
        return None
    cut = line.rfind("](")
    url = line[cut + 2 : -1]
    if cut < start.end() or any(c.isspace() for c in url):
        return None
    return int(start.group(1)), line[start.end() : cut], url


def _hits(block: str, ids: dict[str, str]) -> list[dict[str, Any]]:
    """Each hit of a rendered search (cts.webdancer.search.render_hits): its head line, an
    optional `Date published:` line, then its snippet up to a blank line before the next
    numbered line. One pass over the lines."""
    lines = block.split("\n")
    hits: list[dict[str, Any]] = []
    i = 0
    while i < len(lines):
        head = _hit_head(lines[i])
        i += 1
        if head is None:
            continue
        date = None
        if i < len(lines) and lines[i].startswith("Date published: "):
            date, i = lines[i].removeprefix("Date published: "), i + 1
        if i < len(lines) and lines[i] == "":  # the blank line before the snippet
            i += 1
        start = i
        while i < len(lines) and not (
            lines[i] == "" and i + 1 < len(lines) and _HIT_START.match(lines[i + 1])
        ):
            i += 1
        rank, title, url = head
        snippet = "\n".join(lines[start:i]).strip()
        hits.append(
            {"rank": rank, "title": title, "url": url, "date": date, "snippet": snippet}
            | {"doc_id": ids.get(url)}
        )
    return hits


def _well_formed(entry: Any) -> bool:
    """An evidence entry as webdancer writes it: an object with a url string."""
    return isinstance(entry, dict) and isinstance(entry.get("url"), str)


def _doc_ids(evidence: list[dict[str, str]]) -> dict[str, str]:
    """The corpus doc id of each url, from a step's evidence (a malformed entry is skipped)."""
    return {e["url"]: e.get("id", "") for e in evidence if _well_formed(e)}


def search_blocks(text: str, evidence: list[dict[str, str]]) -> list[dict[str, Any]]:
    """A search tool's text, per query: its hits with the corpus doc id each came from."""
    ids = _doc_ids(evidence)
    blocks = []
    for block in text.split(QUERY_SEPARATOR):
        hits = _hits(block, ids)
        blocks.append(
            {"query": _search_query(block), "hits": hits, "text": "" if hits else block.strip()}
        )
    return blocks


def _page_parts(block: str) -> list[str] | None:
    """url, goal, evidence and summary of a rendered visit (cts.webdancer.visit.render_visit):
    each part up to the first separator after it, as the release's text is laid out."""
    at = block.find(_PAGE_PARTS[0])
    if at < 0:
        return None
    at += len(_PAGE_PARTS[0])
    parts = []
    for separator in _PAGE_PARTS[1:]:
        end = block.find(separator, at)
        if end < 0:
            return None
        parts.append(block[at:end])
        at = end + len(separator)
    return [*parts, block[at:]]


def visited_pages(
    text: str, evidence: list[dict[str, str]], errors: dict[str, str]
) -> list[dict[str, Any]]:
    """A visit tool's text, per page: the evidence and summary its summarizer wrote."""
    ids = _doc_ids(evidence)
    pages = []
    for block in text.split(QUERY_SEPARATOR):
        found = _page_parts(block)
        if found is None:
            pages.append({"url": None, "text": block.strip()})
            continue
        url, goal, evidence_text, summary = found
        pages.append(
            {
                "url": url,
                "goal": goal,
                "evidence": evidence_text.strip(),
                "summary": summary.strip(),
                "doc_id": ids.get(url),
                "error": errors.get(url),
            }
        )
    return pages


def _step_field(step: dict[str, Any], name: str, expected: type, malformed: list[str]) -> Any:
    """A tool step's `evidence` (a list) or `errors` (an object); empty, and said in
    `malformed`, when the trace holds something else there: a trace file is untrusted, and a
    sample is still shown without it."""
    value = step.get(name)
    if value is None:
        return expected()
    if not isinstance(value, expected):
        kind = "a list" if expected is list else "an object"
        malformed.append(f"{name}: expected {kind}, got {type(value).__name__}")
        return expected()
    return value


def observation(step: dict[str, Any]) -> dict[str, Any]:
    """What a tool (or the protocol) answered a model call with; `malformed` names the step's
    fields of the wrong shape, shown as empty."""
    if step.get("kind") == "protocol_error":
        return {"kind": "protocol_error", "message": str(step.get("message", ""))}
    text = str(step.get("result", ""))
    malformed: list[str] = []
    evidence = _step_field(step, "evidence", list, malformed)
    errors = _step_field(step, "errors", dict, malformed)
    if not all(_well_formed(e) for e in evidence):
        malformed.append("evidence: an entry without a url string (skipped)")
    shown: dict[str, Any] = {
        "kind": "tool",
        "tool": step.get("tool"),
        "arguments": step.get("arguments"),
        "doc_ids": step.get("doc_ids") or [],
        "errors": errors,
        "cached": bool(step.get("cached")),
        "text": text,
        "malformed": malformed,
    }
    if step.get("tool") == "search":
        shown["searches"] = search_blocks(text, evidence)
    elif step.get("tool") == "visit":
        shown["pages"] = visited_pages(text, evidence, errors)
    return shown


def trace_turns(trace: dict[str, Any], cuts: Cuts | None = None) -> list[dict[str, Any]]:
    """A search run turn by turn: each model call with the observation that answered it. Each
    step's text and tool response is cut (`cuts`) before it is read."""
    cuts = cuts or Cuts()
    turns: list[dict[str, Any]] = []
    steps = trace.get("steps")
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, dict):
            continue
        step = {
            **step,
            **{k: cuts.text(v) for k in ("text", "result") if isinstance(v := step.get(k), str)},
        }
        if step.get("kind") == "llm":
            turns.append({**model_turn(step), "observation": None})
        elif turns and turns[-1]["observation"] is None:
            turns[-1]["observation"] = observation(step)
        else:  # an observation without its model call (an older trace): shown on its own
            turns.append({"reasoning": "", "text": "", "observation": observation(step)})
    return turns
