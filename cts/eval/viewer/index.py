"""The index of `cts view`: one Row per record of every run, and the query that filters, sorts and
pages it (parsed from the request's parameters, a bad one a ViewError naming it). Apart from
the sample because what the index lists and lets one filter by changes without what a sample
shows, and the other way round; the browser only ever holds one page of rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cts.agents.types import UNKNOWN
from cts.eval.data.schema import Record
from cts.eval.run.config_sections import ALL_CONDITIONS
from cts.eval.viewer.errors import ViewError
from cts.eval.viewer.runs import ViewRun

#: The most rows one page of the index may hold.
MAX_LIMIT = 500
SORTS = ("run", "instance", "condition", "seed", "language", "score", "termination", "stage")
#: Which records the index lists: those config.yaml names (what the report uses), the others,
#: or all.
SCOPES = ("in", "out", "all")


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


class RecordIndex:
    """Every record of every run as a Row, in natural order (instance, condition, seed, run),
    and the answers the API gives from them alone."""

    def __init__(self, runs: Sequence[ViewRun]) -> None:
        self.rows = sorted(
            (
                row_of(run.index, r, key not in run.outside)
                for run in runs
                for key, r in run.records.items()
            ),
            key=_natural,
        )
        self._by_instance: dict[str, list[Row]] = {}
        for row in self.rows:
            self._by_instance.setdefault(row.instance_id, []).append(row)

    def facets(self) -> dict[str, list[str]]:
        """The values the index's filters can take."""
        conditions = sorted({r.condition for r in self.rows}, key=_condition_rank)
        return {
            "conditions": conditions,
            "languages": sorted({r.language for r in self.rows if r.language}),
            "removed": sorted({c for r in self.rows for c in r.removed_constraints}),
        }

    def page(self, query: Query) -> dict[str, Any]:
        """The rows `query` keeps, sorted, and the page of them it asks for."""
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
