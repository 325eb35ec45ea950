"""`cts view`: a read-only browser over run directories, for reading the samples behind a score.

The records of every run directory are read once, at start (a run's file that is not a record
stops it, as it stops `cts report`); the index is filtered, sorted and cut into pages here, so
the browser only ever holds one page of rows. A run resumed narrower keeps records its
config.yaml no longer names: the index lists, as the report does, only the others unless asked,
and counts them as the report does. A sample's trace and its instance (queries,
nuggets) are read when it is opened. Nothing is ever written into a run directory, and no
file is served but the viewer's own pages and, through the API, what the records name: a
trace path is resolved and must stay inside its run's traces/ folder.

Everything shown is untrusted text (instance ids, model outputs, pages): the pages build the
DOM with text nodes only, and the API sends it as JSON.
"""

from __future__ import annotations

import math
import re
import threading
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from cts.agents.types import UNKNOWN
from cts.eval.data.dataset import DatasetError, load_instances
from cts.eval.data.schema import Instance, Record
from cts.eval.run.config import ALL_CONDITIONS, ExperimentConfig
from cts.eval.run.run_dir import RunDir
from cts.eval.run.runner import Key, RecordStore
from cts.eval.run.scope import in_scope, outside_because
from cts.eval.run.traces import inside, read_trace_file
from cts.serving.yaml_config import ConfigError
from cts.webdancer.protocol import FinalAnswer, ProtocolError, ToolCall, parse_turn
from cts.webdancer.search import QUERY_SEPARATOR

#: The most rows one page of the index may hold.
MAX_LIMIT = 500
#: The most characters of one text a sample shows (an answer, a model turn, a tool's response,
#: a quote): a longer one is cut, saying its length, and the raw record or trace (/api/raw)
#: holds it whole. Every parse and mark works on cut text, so a request's work is linear in
#: what it reads and bounded, whatever a record or trace holds.
MAX_FIELD_CHARS = 20_000
#: The quotes of at most this many nuggets are marked in the answer (each is looked for once).
MAX_QUOTES = 100
#: JSON nested deeper than this (a tool call's arguments) is shown as a note, not sent.
MAX_DEPTH = 32
#: A judge's quote shorter than this is not looked for in the answer: it would mark every
#: "e" or "n1" and tell the reader nothing.
MIN_QUOTE_CHARS = 3
SORTS = ("run", "instance", "condition", "seed", "language", "score", "termination", "stage")
#: Which records the index lists: those config.yaml names (what the report uses), the others,
#: or all.
SCOPES = ("in", "out", "all")


class Cuts:
    """Cuts every text a sample shows to MAX_FIELD_CHARS, and remembers whether it cut one."""

    def __init__(self, limit: int = MAX_FIELD_CHARS) -> None:
        self.limit = limit
        self.cut = False

    def text(self, value: str) -> str:
        if len(value) <= self.limit:
            return value
        self.cut = True
        return (
            value[: self.limit]
            + f"\n… [cut: {len(value):,} characters in all; the raw file holds them all]"
        )

    def json(self, value: Any, depth: int = 0) -> Any:
        """`value` with every string cut and nothing nested deeper than MAX_DEPTH."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, (dict, list)) and depth >= MAX_DEPTH:
            self.cut = True
            return f"[nested more than {MAX_DEPTH} deep: the raw file holds it]"
        if isinstance(value, dict):
            return {self.text(str(k)): self.json(v, depth + 1) for k, v in value.items()}
        if isinstance(value, list):
            return [self.json(v, depth + 1) for v in value]
        return value


class ViewError(ValueError):
    """A request the viewer cannot answer (a bad filter value), or an address it cannot bind."""


class NotFound(LookupError):
    """No record of that run, instance, condition and seed."""


# -- one run directory ------------------------------------------------------------------------


@dataclass
class Row:
    """What the index shows of one record."""

    run: int
    instance_id: str
    condition: str
    seed: int
    language: str
    removed_constraints: list[str]
    score: float | None
    failed: bool
    stage: str
    kind: str
    questions: int
    unknown_answers: int
    all_unknown: bool
    termination: str
    answer: str
    #: Whether config.yaml names its key, i.e. the report uses it (cts/eval/run/scope.py).
    in_scope: bool = True

    def as_dict(self) -> dict[str, Any]:
        # Shallow, unlike dataclasses.asdict: the index makes one per record of every run.
        return dict(vars(self))


def row_of(run: int, record: Record, in_scope: bool = True) -> Row:
    unknown = sum(a == UNKNOWN for a in record.answers)
    error = record.error or {}
    return Row(
        run=run,
        instance_id=record.instance_id,
        condition=record.condition,
        seed=record.seed,
        language=record.language,
        removed_constraints=list(record.removed_constraints),
        score=record.scores.get("restore_score_100") if record.error is None else None,
        failed=record.error is not None,
        stage=error.get("stage", ""),
        kind=error.get("kind", ""),
        questions=len(record.questions),
        unknown_answers=unknown,
        # As the report counts it: a clarifier that asked nothing has nothing to be unknown.
        all_unknown=bool(record.answers) and unknown == len(record.answers),
        termination=record.termination,
        answer=record.answer[:160],
        in_scope=in_scope,
    )


@dataclass
class ViewRun:
    """A run directory as the viewer holds it: its records at start, the rest when asked."""

    index: int
    root: Path
    name: str
    #: None when config.yaml no longer loads (written by an older version): the records are
    #: still shown, without the dataset's queries and nuggets.
    experiment: ExperimentConfig | None
    records: dict[Key, Record]
    config_error: str | None = None
    #: The records config.yaml no longer names (a narrowing resume keeps them), with why.
    outside: dict[Key, str] = field(default_factory=dict)
    #: Their counts, as the report's summary.json gives them (`ignored_records`).
    ignored: dict[str, Any] = field(default_factory=dict)
    #: Every instance of the dataset, past dataset.limit too, by id, in the dataset's order.
    _instances: dict[str, Instance] | None = None
    _dataset_error: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def traces(self) -> Path:
        return RunDir(self.root).traces

    def dataset(self) -> tuple[dict[str, Instance] | None, str | None]:
        """Every instance of the run's dataset by id, or why it cannot be read here (the
        dataset moved, or is a hub dataset not cached on this machine). Read once, without
        dataset.limit: the records a narrowing resume kept name instances past it."""
        if self.experiment is None:
            return None, self.config_error
        with self._lock:
            if self._instances is None and self._dataset_error is None:
                source = self.experiment.dataset.model_copy(update={"limit": None})
                try:
                    self._instances = {i.id: i for i in load_instances(source)}
                except (DatasetError, OSError) as e:
                    self._dataset_error = f"the run's dataset cannot be read here: {e}"
        return self._instances, self._dataset_error

    def instance(self, instance_id: str) -> tuple[Instance | None, str | None]:
        """The instance as the run's dataset holds it, or why it cannot be read here."""
        instances, error = self.dataset()
        if instances is None:
            return None, error
        found = instances.get(instance_id)
        return found, None if found else "not in the run's dataset (any more)"

    def tag_scope(self) -> None:
        """Sets `outside` and `ignored`: what config.yaml does not name, as the report counts
        it (cts/eval/run/scope.py). Only a dataset.limit can leave instances out, so without one
        the dataset is not read here (it is, when a sample opens)."""
        if self.experiment is None:  # nothing to check against: every record is shown
            self.ignored = in_scope([], (), (), None).as_dict()
            return
        conditions, seeds = self.experiment.conditions, self.experiment.seeds
        beyond: list[str] | None = []
        if limit := self.experiment.dataset.limit:
            instances, _ = self.dataset()
            beyond = None if instances is None else list(instances)[limit:]
        self.ignored = in_scope(self.records.values(), conditions, seeds, beyond).as_dict()
        self.outside = {
            key: why
            for key, record in self.records.items()
            if (why := outside_because(record, conditions, seeds, beyond or ()))
        }

    def trace_file(self, record: Record) -> tuple[Path | None, str | None]:
        """The record's trace file, or why there is none. The path comes from a record, which
        is untrusted: it must resolve to a file inside this run's traces/."""
        if not record.trace_id:
            return None, "the record names no trace"
        path = inside(self.traces, record.trace_id)
        if path is None:
            return None, f"trace path {record.trace_id!r} leaves the run's traces/: not read"
        if not path.is_file():
            return None, f"trace file missing: traces/{record.trace_id}"
        return path, None

    def trace(self, record: Record) -> tuple[dict[str, Any] | None, str | None]:
        """The record's trace, or why there is none."""
        path, error = self.trace_file(record)
        if path is None:
            return None, error
        return read_trace_file(path)


def load_run(index: int, root: Path) -> ViewRun:
    """A run directory's config and counted records (RunDirError without config.yaml,
    RecordFileError for a line that is not a record). Reads only. A config.yaml that does not
    load any more is no reason not to read the records: it is reported, not raised. The
    records config.yaml no longer names are kept, tagged (ViewRun.tag_scope)."""
    try:
        resolved = RunDir(root).read_config()
    except ConfigError as e:
        records = RecordStore(root).completed()
        problem = f"the run's config.yaml does not load: {e}"
        view = ViewRun(index, root.resolve(), root.name, None, records, problem)
    else:
        records = RecordStore(root).completed()
        view = ViewRun(index, root.resolve(), resolved.system_name(), resolved.experiment, records)
    view.tag_scope()
    return view


# -- the index --------------------------------------------------------------------------------


@dataclass
class Query:
    """One request of the index: filters, sort and page."""

    runs: list[int] = field(default_factory=list)
    conditions: list[str] = field(default_factory=list)
    languages: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: bool | None = None
    all_unknown: bool | None = None
    score_min: float | None = None
    score_max: float | None = None
    text: str = ""
    sort: str = "instance"
    descending: bool = False
    offset: int = 0
    limit: int = 50
    #: One of SCOPES: by default the records the report uses.
    scope: str = "in"


def _values(params: Mapping[str, Sequence[str]], name: str) -> list[str]:
    """Every value of a parameter given repeatedly or comma-separated; blanks dropped."""
    return [v for raw in params.get(name, []) for v in raw.split(",") if v.strip()]


def _one(params: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = [v for v in params.get(name, []) if v.strip()]
    return values[-1].strip() if values else None


def _number(params: Mapping[str, Sequence[str]], name: str, cast: Callable[[str], Any]) -> Any:
    value = _one(params, name)
    if value is None:
        return None
    try:
        return cast(value)
    except ValueError:
        kind = "a whole number" if cast is int else "a number"
        raise ViewError(f"{name}: expected {kind}, got {value!r}") from None


def _finite(params: Mapping[str, Sequence[str]], name: str) -> float | None:
    """A score bound: `nan` compares false with every score, so it kept every row."""
    value: float | None = _number(params, name, float)
    if value is not None and not math.isfinite(value):
        raise ViewError(f"{name}: expected a finite number, got {_one(params, name)!r}")
    return value


def _flag(params: Mapping[str, Sequence[str]], name: str) -> bool | None:
    value = _one(params, name)
    if value is None or value == "any":
        return None
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise ViewError(f"{name}: expected 1, 0 or any, got {value!r}")


def parse_query(params: Mapping[str, Sequence[str]]) -> Query:
    """The index query of request parameters; ViewError naming the parameter for a bad one."""
    sort = _one(params, "sort") or "instance"
    if sort not in SORTS:
        raise ViewError(f"sort: expected one of {', '.join(SORTS)}, got {sort!r}")
    order = _one(params, "order") or "asc"
    if order not in ("asc", "desc"):
        raise ViewError(f"order: expected asc or desc, got {order!r}")
    try:
        runs = [int(v) for v in _values(params, "run")]
    except ValueError:
        raise ViewError(f"run: expected run numbers, got {params.get('run')!r}") from None
    offset = _number(params, "offset", int)
    limit = _number(params, "limit", int)
    if offset is not None and offset < 0:
        raise ViewError(f"offset: must be 0 or more, got {offset}")
    if limit is not None and not 1 <= limit <= MAX_LIMIT:
        raise ViewError(f"limit: must be between 1 and {MAX_LIMIT}, got {limit}")
    scope = _one(params, "scope") or "in"
    if scope not in SCOPES:
        raise ViewError(f"scope: expected one of {', '.join(SCOPES)}, got {scope!r}")
    return Query(
        runs=runs,
        conditions=_values(params, "condition"),
        languages=_values(params, "language"),
        removed=_values(params, "removed"),
        failed=_flag(params, "failed"),
        all_unknown=_flag(params, "all_unknown"),
        score_min=_finite(params, "score_min"),
        score_max=_finite(params, "score_max"),
        text=(_one(params, "q") or "").casefold(),
        sort=sort,
        descending=order == "desc",
        offset=offset or 0,
        limit=limit or 50,
        scope=scope,
    )


def _keep(row: Row, query: Query) -> bool:
    if query.scope != "all" and row.in_scope != (query.scope == "in"):
        return False
    if query.runs and row.run not in query.runs:
        return False
    if query.conditions and row.condition not in query.conditions:
        return False
    if query.languages and row.language not in query.languages:
        return False
    if query.removed and not set(query.removed) & set(row.removed_constraints):
        return False
    if query.failed is not None and row.failed != query.failed:
        return False
    if query.all_unknown is not None and row.all_unknown != query.all_unknown:
        return False
    if query.score_min is not None or query.score_max is not None:
        if row.score is None:
            return False
        if query.score_min is not None and row.score < query.score_min:
            return False
        if query.score_max is not None and row.score > query.score_max:
            return False
    return not query.text or query.text in row.instance_id.casefold()


def _condition_rank(condition: str) -> tuple[int, str]:
    order: list[str] = list(ALL_CONDITIONS)
    return (order.index(condition), "") if condition in order else (len(order), condition)


def _natural(row: Row) -> tuple[Any, ...]:
    return (row.instance_id, _condition_rank(row.condition), row.seed, row.run)


#: Per sort field, the value rows are ordered by (a missing one goes last either way).
_SORT_KEYS: dict[str, Callable[[Row], Any]] = {
    "run": lambda r: r.run,
    "instance": lambda r: r.instance_id,
    "condition": lambda r: _condition_rank(r.condition),
    "seed": lambda r: r.seed,
    "language": lambda r: r.language or None,
    "score": lambda r: r.score,
    "termination": lambda r: r.termination or None,
    "stage": lambda r: r.stage or None,
}


def sort_rows(rows: list[Row], sort: str, descending: bool) -> list[Row]:
    """Rows by one field, ties in their natural order (instance, condition, seed, run); rows
    without the field's value (no score, no error) last in both directions."""
    value = _SORT_KEYS[sort]
    ordered = sorted(rows, key=_natural)
    present = [r for r in ordered if value(r) is not None]
    missing = [r for r in ordered if value(r) is None]
    present.sort(key=value, reverse=descending)  # stable: ties keep the natural order
    return present + missing


# -- a sample ---------------------------------------------------------------------------------

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


class _Lower(dict[int, str]):
    """str.translate's table: each character lower-cased when that is one character ('İ'
    lowers to two, and stays): folded text keeps every position of the original."""

    def __missing__(self, code: int) -> str:
        lower = chr(code).lower()
        self[code] = lower if len(lower) == 1 else chr(code)
        return self[code]


_LOWER = _Lower()
_SPACES = re.compile(r"\s+")


def _folded(text: str) -> tuple[str, list[int], list[int]]:
    """`text` lower-cased with each run of white space made one space, and where each run
    ended in both (folded position, original position), to map a match back. One pass over
    the text and one step per run of white space."""
    lowered = text.translate(_LOWER)
    parts: list[str] = []
    folded_at, original_at = [0], [0]
    last = size = 0
    for run in _SPACES.finditer(lowered):
        parts += [lowered[last : run.start()], " "]
        size += run.start() - last + 1
        last = run.end()
        folded_at.append(size)
        original_at.append(last)
    parts.append(lowered[last:])
    return "".join(parts), folded_at, original_at


def _spans(answer: tuple[str, list[int], list[int]], quote: str) -> list[tuple[int, int]]:
    """Where `quote` occurs in the folded answer (non-overlapping, left to right), as spans
    (first, last character) of the original."""
    folded, folded_at, original_at = answer
    needle = " ".join(quote.split()).translate(_LOWER)

    def original(position: int) -> int:  # a position that is not white space
        run = bisect_right(folded_at, position) - 1
        return original_at[run] + position - folded_at[run]

    spans = []
    at = folded.find(needle)
    while at >= 0:
        last = at + len(needle) - 1
        spans.append((original(at), original(last)))
        at = folded.find(needle, last + 1)
    return spans


def highlight(answer: str, quotes: Mapping[str, str]) -> list[dict[str, Any]]:
    """The answer cut into segments, each with the nuggets whose judge quote covers it
    (matched ignoring case and runs of white space, every occurrence). One pass over the
    answer per quote, and one over the quotes' boundaries: linear in the answer."""
    folded = _folded(answer)
    edges: dict[int, list[tuple[int, str]]] = {}
    for nugget_id, quote in list(quotes.items())[:MAX_QUOTES]:
        if len("".join(quote.split())) < MIN_QUOTE_CHARS:
            continue
        for first, last in _spans(folded, quote):
            edges.setdefault(first, []).append((1, nugget_id))
            edges.setdefault(last + 1, []).append((-1, nugget_id))
    active: dict[str, int] = {}
    ranges: list[tuple[int, int, list[str]]] = []  # (start, end, nuggets), merged as they come
    bounds = sorted({0, len(answer), *edges})
    for start, end in pairwise(bounds):
        for change, nugget_id in edges.get(start, []):
            active[nugget_id] = active.get(nugget_id, 0) + change
            if not active[nugget_id]:
                del active[nugget_id]
        nuggets = sorted(active)
        if ranges and ranges[-1][2] == nuggets:
            ranges[-1] = (ranges[-1][0], end, nuggets)
        else:
            ranges.append((start, end, nuggets))
    return [{"text": answer[start:end], "nuggets": ids} for start, end, ids in ranges]


def nugget_rows(record: Record, instance: Instance | None) -> list[dict[str, Any]]:
    """Each golden nugget with the judge's label and quote for this record; labels of
    nuggets the dataset no longer holds are kept, without text."""
    golden = instance.golden.nuggets if instance and instance.golden else []
    rows = []
    for nugget in golden:
        label = record.labels.get(nugget.id, {})
        rows.append(
            {
                "id": nugget.id,
                "text": nugget.text,
                "weight": nugget.weight,
                "label": label.get("label"),
                "evidence": label.get("evidence"),
                "position": label.get("position"),
            }
        )
    known = {n.id for n in golden}
    for nugget_id, label in record.labels.items():
        if nugget_id not in known:
            rows.append(
                {
                    "id": nugget_id,
                    "text": None,
                    "weight": None,
                    "label": label.get("label"),
                    "evidence": label.get("evidence"),
                    "position": label.get("position"),
                }
            )
    return rows


def _malformed_steps(turns: list[dict[str, Any]]) -> str | None:
    """The trace's steps of the wrong shape, turn by turn: the sample's trace_error."""
    found = [
        f"turn {n}: {problem}"
        for n, turn in enumerate(turns, 1)
        for problem in (turn["observation"] or {}).get("malformed", [])
    ]
    if not found:
        return None
    return f"malformed trace steps (shown without them): {'; '.join(found)}"


# -- the viewer -------------------------------------------------------------------------------


class Viewer:
    """Every run directory given, and the answers the API gives about them."""

    def __init__(self, run_dirs: Sequence[Path]) -> None:
        self.runs = [load_run(i, Path(d)) for i, d in enumerate(run_dirs)]
        names = [r.name for r in self.runs]
        folders = [r.root.name for r in self.runs]
        for run in self.runs:
            if names.count(run.name) > 1:  # same experiment and clarifier: tell them apart
                where = run.root.name if folders.count(run.root.name) == 1 else str(run.root)
                run.name = f"{run.name} [{where}]"
        self.rows = sorted(
            (
                row_of(run.index, r, key not in run.outside)
                for run in self.runs
                for key, r in run.records.items()
            ),
            key=_natural,
        )
        self._by_instance: dict[str, list[Row]] = {}
        for row in self.rows:
            self._by_instance.setdefault(row.instance_id, []).append(row)

    def describe_runs(self) -> list[dict[str, Any]]:
        """Each run: its records and failures as its report counts them (those config.yaml
        names), all it stores, and the rest counted by why (`ignored`)."""
        return [
            {
                "id": run.index,
                "name": run.name,
                "path": str(run.root),
                "experiment": run.experiment.name if run.experiment else None,
                "records": len(run.records) - len(run.outside),
                "failed": sum(
                    r.error is not None for k, r in run.records.items() if k not in run.outside
                ),
                "stored": len(run.records),
                "ignored": run.ignored,
                "config_error": run.config_error,
            }
            for run in self.runs
        ]

    def facets(self) -> dict[str, list[str]]:
        """The values the index's filters can take."""
        conditions = sorted({r.condition for r in self.rows}, key=_condition_rank)
        return {
            "conditions": conditions,
            "languages": sorted({r.language for r in self.rows if r.language}),
            "removed": sorted({c for r in self.rows for c in r.removed_constraints}),
        }

    def index(self, query: Query) -> dict[str, Any]:
        kept = [r for r in self.rows if _keep(r, query)]
        if query.sort != "instance" or query.descending:
            kept = sort_rows(kept, query.sort, query.descending)
        page = kept[query.offset : query.offset + query.limit]
        return {
            "total": len(kept),
            "offset": query.offset,
            "limit": query.limit,
            "rows": [r.as_dict() for r in page],
        }

    def keys(self, instance_id: str) -> list[dict[str, Any]]:
        """Every record of one instance, in every run: what it can be compared across."""
        return [r.as_dict() for r in self._by_instance.get(instance_id, [])]

    def record(self, run: int, instance_id: str, condition: str, seed: int) -> Record:
        if not 0 <= run < len(self.runs):
            raise NotFound(f"no run {run}")
        found = self.runs[run].records.get((instance_id, condition, seed))
        if found is None:
            raise NotFound(f"run {run} has no record of {instance_id!r} {condition} seed {seed}")
        return found

    def sample(self, run: int, instance_id: str, condition: str, seed: int) -> dict[str, Any]:
        """One record with all it stands on: instance, dialogue, search trace, labels."""
        record = self.record(run, instance_id, condition, seed)
        view = self.runs[run]
        instance, instance_error = view.instance(instance_id)
        trace, trace_error = view.trace(record)
        cuts = Cuts()
        turns = trace_turns(trace, cuts) if trace is not None else []
        trace_error = trace_error or _malformed_steps(turns)
        nuggets = cuts.json(nugget_rows(record, instance))
        quotes = {n["id"]: n["evidence"] or "" for n in nuggets}
        key = {"run": run, "instance": instance_id, "condition": condition, "seed": seed}
        outside = view.outside.get(record.key)
        shown = {
            "run": {"id": view.index, "name": view.name, "path": str(view.root)},
            "record": record.model_dump(mode="json"),
            "in_scope": outside is None,
            "scope_note": None
            if outside is None
            else f"Outside what the run's config.yaml names ({outside}): its report ignores "
            "this record, kept from before the run was resumed narrower.",
            "instance": None
            if instance is None
            else {
                "blurred_query": instance.blurred_query,
                "fused_query": instance.fused_query,
                "language": instance.language,
                "removed_constraints": list(instance.removed_constraints),
            },
            "instance_error": instance_error,
            "dialogue": [
                {
                    "question": q,
                    "answer": record.answers[i] if i < len(record.answers) else None,
                    "question_types": record.question_types[i]
                    if i < len(record.question_types)
                    else [],
                    "unknown": i < len(record.answers) and record.answers[i] == UNKNOWN,
                }
                for i, q in enumerate(record.questions)
            ],
            "nuggets": nuggets,
            "answer_segments": highlight(cuts.text(record.answer), quotes),
            "trace": None
            if trace is None
            else {
                "termination": trace.get("termination"),
                "error": trace.get("error"),
                "llm_calls": trace.get("llm_calls"),
                "seconds": trace.get("seconds"),
                "turns": turns,
            },
            "trace_error": trace_error,
            "raw": {
                part: f"/api/raw?{urlencode({**key, 'part': part})}" for part in ("record", "trace")
            },
        }
        bounded: dict[str, Any] = cuts.json(shown)
        bounded["cut"] = cuts.cut  # a text was cut: the page says so, with the raw links
        return bounded

    def raw(self, run: int, instance_id: str, condition: str, seed: int, part: str) -> bytes | Path:
        """What a sample stands on, whole: its record (a JSON line) or its trace file."""
        record = self.record(run, instance_id, condition, seed)
        if part == "record":
            return record.model_dump_json().encode()
        if part != "trace":
            raise ViewError(f"part: expected record or trace, got {part!r}")
        path, error = self.runs[run].trace_file(record)
        if path is None:
            raise NotFound(str(error))
        return path
