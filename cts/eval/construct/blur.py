"""`cts data blur`: fused queries into benchmark instances. For each fused query, `per_query`
blurred variants, each removing `remove` of the constraints it states, drawn by type with the
weights of `mix`; the `blurrer` role writes the blurred query (cts/agents/blurrer.py), and every row
is checked (cts/eval/construct/checks.py: spans, the question, recoverability by the User Answerer)
before it is written. Accepted rows become instances (`removed_constraints` as `{type, span}`);
the others go to the rejects file with their reasons; a summary counts both, by reason, and
sets the removed types' mix beside the one asked for."""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from cts.agents import blurrer, user_answerer
from cts.agents.fuser import StatedConstraint
from cts.agents.question_type import QUESTION_TYPES
from cts.agents.user_answerer import SpanLimits
from cts.eval.construct.checks import (
    Recovery,
    Rejection,
    question_rejections,
    recovery_question,
    recovery_rejections,
    removed_rejections,
    span_rejections,
)
from cts.eval.construct.fuse import Provenance, parts_dir, provenance
from cts.eval.construct.store import (
    BuildControl,
    BuildOutcome,
    BuildRow,
    RowStore,
    SettingsChanged,
    check_settings,
    digest,
    run_rows,
)
from cts.eval.data.readers import DatasetError
from cts.eval.data.schema import Instance, known_language, unsafe_id
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import Role
from cts.eval.run.engines import open_engines
from cts.foundation.disk import write_whole
from cts.serving.engine import ChatModel
from cts.serving.errors import EngineError
from cts.webdancer.corpus import Problem

#: The removed types' weights when none are given: the study's data leans to time, region and
#: scope.
DEFAULT_MIX: dict[str, float] = {
    "time": 0.3,
    "region": 0.25,
    "scope": 0.2,
    "entity": 0.1,
    "numeric": 0.1,
    "definition": 0.05,
}


class BlurError(ValueError):
    """Blur settings that cannot be used (a bad --mix, a resume with other settings)."""


def parse_mix(text: str) -> dict[str, float]:
    """`time=0.3,region=0.2,…` as weights (they need not sum to 1); BlurError for an unknown
    type, a weight that is not a number ≥ 0, or no positive weight."""
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name.strip() not in QUESTION_TYPES:
            raise BlurError(f"--mix {part!r}: unknown type (one of {', '.join(QUESTION_TYPES)})")
        try:
            weight = float(value)
        except ValueError:
            raise BlurError(f"--mix {part!r}: the weight is not a number") from None
        if not (weight >= 0 and math.isfinite(weight)):
            raise BlurError(f"--mix {part!r}: a weight is a finite number, at least 0")
        mix[name.strip()] = weight
    if not any(w > 0 for w in mix.values()):
        raise BlurError(f"--mix {text!r}: no type has a positive weight")
    return mix


@dataclass(frozen=True)
class BlurPlan:
    """What to blur: the settings a resumed run must share (recorded as plan.json)."""

    mix: dict[str, float]
    per_query: int = 1
    remove: int = 1
    seed: int = 0
    #: Whether the blurred query is still a question: by `rules` alone, or also asking the
    #: `judge` role's model.
    question_check: Literal["rules", "judge"] = "rules"

    @property
    def roles(self) -> list[Role]:
        """The roles a blur with this plan asks."""
        judge: list[Role] = ["judge"] if self.question_check == "judge" else []
        return ["blurrer", "user_answerer", *judge]

    def document(self) -> dict[str, Any]:
        return asdict(self)


class FusedQuery(BaseModel):
    """A fused query to blur: a row of `cts data fuse`'s output (its other fields ignored)."""

    key: str
    language: str = "en"
    fused_query: str
    constraints: list[StatedConstraint] = Field(default_factory=list)


def read_fused(path: Path) -> tuple[list[FusedQuery], int]:
    """The fused queries of `path` (rows without one, a failed fuse, are skipped and counted);
    DatasetError naming `file:line: field` for a line that is not a fused query or repeats a
    key (its row would stand for both)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError([Problem(str(path), None, "<file>", f"cannot read: {e}")]) from e
    found, skipped, problems = [], 0, []
    first_line: dict[str, int] = {}  # each key's line: a key names its rows and instances
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if isinstance(data, dict) and "key" not in data and "id" in data:
                data = {**data, "key": data["id"]}
            if isinstance(data, dict) and (data.get("error") or not data.get("fused_query")):
                skipped += 1
                continue
            row = FusedQuery.model_validate(data)
        except ValueError as e:
            where, message = _where(e)
            problems.append(Problem(str(path), n, where, message))
            continue
        if not known_language(row.language):
            problems.append(Problem(str(path), n, "language", f"unknown {row.language!r}"))
        why = unsafe_id(f"{row.key}-b0")  # the key names its instances
        if why is not None:
            problems.append(Problem(str(path), n, "key", f"{row.key!r} {why}"))
        if row.key in first_line:
            why = f"{row.key!r}: duplicate of line {first_line[row.key]}"
            problems.append(Problem(str(path), n, "key", why))
            continue
        first_line[row.key] = n
        found.append(row)
    if problems:
        raise DatasetError(problems)
    return found, skipped


def _where(error: ValueError) -> tuple[str, str]:
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        return ".".join(str(x) for x in first["loc"]) or "<line>", first["msg"]
    return "<line>", f"not JSON: {error}"


def draw_targets(row: FusedQuery, plan: BlurPlan) -> list[list[StatedConstraint]]:
    """Per variant, the constraints it removes: `remove` of the row's constraints whose type has
    a positive weight, drawn by weight without replacement across the row's variants (so two
    variants remove different things); fewer variants when the row runs out."""
    rng = random.Random(f"{plan.seed}:{row.key}")
    pool = [c for c in row.constraints if plan.mix.get(c.type, 0) > 0]
    variants = []
    for _ in range(plan.per_query):
        if len(pool) < plan.remove:
            break
        chosen = []
        for _ in range(plan.remove):
            pick = rng.choices(range(len(pool)), [plan.mix[c.type] for c in pool])[0]
            chosen.append(pool.pop(pick))
        variants.append(chosen)
    return variants


class RecoveryRow(BaseModel):
    type: str
    span: str
    question: str
    from_fused: str
    from_blurred: str


class BlurredRow(BuildRow):
    """One line of the blur's shard files: the key is `<fused key>#b<variant>`."""

    fused_key: str
    variant: int
    language: str
    fused_query: str
    targets: list[StatedConstraint]
    blurred_query: str = ""
    removed: list[StatedConstraint] = Field(default_factory=list)
    #: The User Answerer's answers (asked only when the rules passed).
    recovery: list[RecoveryRow] = Field(default_factory=list)
    #: Why the row is not an instance ([]: accepted).
    rejected: list[dict[str, str]] = Field(default_factory=list)
    provenance: dict[str, Provenance] = Field(default_factory=dict)

    @property
    def accepted(self) -> bool:
        return self.error is None and not self.rejected

    def instance(self) -> dict[str, Any]:
        """The benchmark instance an accepted row is."""
        return {
            "id": f"{self.fused_key}-b{self.variant}",
            "language": self.language,
            "blurred_query": self.blurred_query,
            "fused_query": self.fused_query,
            "removed_constraints": [c.model_dump() for c in self.removed],
            "meta": {
                "fused_key": self.fused_key,
                "recovery": [r.model_dump() for r in self.recovery],
                "provenance": {k: v.model_dump() for k, v in self.provenance.items()},
            },
        }


@dataclass(frozen=True)
class BlurRoles:
    blurrer: ChatModel
    user_answerer: ChatModel
    resolved: ResolvedExperiment
    seed: int
    #: The judge's model, for `question_check: judge` (None: rules only).
    judge: ChatModel | None = None


async def blur_one(roles: BlurRoles, row: BlurredRow) -> BlurredRow:
    """Blur one variant and check it: the row with its blurred query, answers and reasons."""
    resolved, seed = roles.resolved, roles.seed
    sampling = resolved.sampling_for("blurrer").with_seed(seed)
    try:
        found = await blurrer.blur(
            roles.blurrer, row.fused_query, row.targets, row.language, sampling
        )
        # The drawn targets are what must be gone, whatever the Blurrer says it removed.
        rejections = removed_rejections(row.targets, found.removed)
        rejections += span_rejections(row.fused_query, found.blurred_query, row.targets)
        rejections += question_rejections(row.fused_query, found.blurred_query, row.targets)
        if not rejections and roles.judge is not None:
            rejections += await _judged_question(roles, found.blurred_query, row.language)
        recovery: list[Recovery] = []
        if not rejections:
            recovery = await _recover(roles, row, found.blurred_query, row.targets)
            rejections += recovery_rejections(recovery)
    except (EngineError, ValidationError) as e:
        return row.model_copy(update={"error": f"{type(e).__name__}: {e}"[:500]})
    return row.model_copy(
        update={
            "blurred_query": found.blurred_query,
            "removed": found.removed,
            "recovery": [RecoveryRow(**vars(r)) for r in recovery],
            "rejected": [vars(r) for r in _once(rejections)],
        }
    )


async def _judged_question(roles: BlurRoles, blurred_query: str, language: str) -> list[Rejection]:
    assert roles.judge is not None
    sampling = blurrer.QUESTION_SAMPLING.apply(roles.resolved.configured_sampling("judge"))
    if await blurrer.is_question(roles.judge, blurred_query, language, sampling):
        return []
    return [Rejection("not_a_question", f"the judge: no ({blurred_query!r})")]


def _once(rejections: Sequence[Rejection]) -> list[Rejection]:
    return list(dict.fromkeys(rejections))


async def _recover(
    roles: BlurRoles, row: BlurredRow, blurred_query: str, removed: Sequence[StatedConstraint]
) -> list[Recovery]:
    """Per removed constraint, the User Answerer's answer to a question about its type, once
    knowing the fused query and once knowing only the blurred one."""
    resolved = roles.resolved
    sampling = resolved.sampling_for("user_answerer").with_seed(roles.seed)
    limits = SpanLimits(**resolved.experiment.clarification.answer_span.model_dump())
    found = []
    for c in removed:
        question = recovery_question(c.type, row.language)
        answers = [
            await user_answerer.answer(
                roles.user_answerer, intent, question, row.language, sampling, limits=limits
            )
            for intent in (row.fused_query, blurred_query)
        ]
        found.append(Recovery(c.type, c.span, question, answers[0], answers[1]))
    return found


def role_provenance(resolved: ResolvedExperiment, plan: BlurPlan) -> dict[str, Provenance]:
    """Where each role of a blur with `plan` comes from: its model, prompt and seed."""
    made = {
        "blurrer": provenance(resolved, "blurrer", plan.seed),
        "user_answerer": provenance(resolved, "user_answerer", plan.seed),
    }
    if plan.question_check == "judge":
        made["judge"] = provenance(resolved, "judge", plan.seed, "question_check")
    return made


def planned_rows(
    fused: Sequence[FusedQuery], plan: BlurPlan, made: dict[str, Provenance]
) -> dict[str, BlurredRow]:
    """Every variant to blur, by key, before any model call."""
    rows = {}
    for f in fused:
        for v, targets in enumerate(draw_targets(f, plan)):
            key = f"{f.key}#b{v}"
            rows[key] = BlurredRow(
                key=key,
                fused_key=f.key,
                variant=v,
                language=f.language,
                fused_query=f.fused_query,
                targets=targets,
                provenance=made,
            )
    return rows


def _check_plan(
    folder: Path, plan: BlurPlan, fused: Sequence[FusedQuery], made: dict[str, Provenance]
) -> None:
    """A resumed blur keeps its settings, its fused queries and its roles' models and prompts
    (a finished row is never made again): BlurError naming what changed."""
    settings = {
        **plan.document(),
        "fused_queries": digest([f.model_dump() for f in fused]),
        **{role: p.model_dump(exclude={"role", "seed"}) for role, p in made.items()},
    }
    try:
        check_settings(folder, settings, "blurred")
    except SettingsChanged as e:
        raise BlurError(str(e)) from None


@dataclass(frozen=True)
class BlurResult:
    outcome: BuildOutcome
    #: The summary once every row is done (None: rows are missing, e.g. other shards').
    summary: dict[str, Any] | None


def blur_file(
    resolved: ResolvedExperiment,
    fused_path: Path,
    out: Path,
    plan: BlurPlan,
    control: BuildControl,
) -> BlurResult:
    """Blur (the shard's share of) `fused_path`'s queries, resuming from `<out>.parts/`; once
    every row is done, write the accepted instances to `out`, the rejects beside it
    (`<stem>.rejects.jsonl`) and the summary (`<stem>.summary.json`)."""
    fused, skipped = read_fused(fused_path)
    folder = parts_dir(out)
    made = role_provenance(resolved, plan)
    _check_plan(folder, plan, fused, made)
    rows = planned_rows(fused, plan, made)
    store = RowStore(folder, BlurredRow)

    @asynccontextmanager
    async def blurring() -> AsyncIterator[Callable[[str], Awaitable[BlurredRow]]]:
        async with open_engines(resolved, plan.roles) as engines:
            roles = BlurRoles(
                engines.roles["blurrer"],
                engines.roles["user_answerer"],
                resolved,
                plan.seed,
                engines.roles.get("judge"),
            )
            yield lambda key: blur_one(roles, rows[key])

    outcome = asyncio.run(run_rows(store, list(rows), blurring, control))
    done = store.rows()
    if any(k not in done for k in rows):
        return BlurResult(outcome, None)
    ordered = [done[k] for k in rows]
    return BlurResult(outcome, write_blurred(ordered, out, plan, len(fused), skipped))


def write_blurred(
    rows: Sequence[BlurredRow], out: Path, plan: BlurPlan, fused: int, skipped: int
) -> dict[str, Any]:
    """The instances, the rejects and the summary of a finished blur."""
    accepted = [r for r in rows if r.accepted]
    for r in accepted:
        Instance.model_validate(r.instance())  # the checks admit nothing a dataset refuses
    out.parent.mkdir(parents=True, exist_ok=True)
    write_whole(out, "".join(json.dumps(r.instance(), ensure_ascii=False) + "\n" for r in accepted))
    rejects = [r for r in rows if not r.accepted]
    write_whole(
        out.with_name(out.stem + ".rejects.jsonl"),
        "".join(r.model_dump_json() + "\n" for r in rejects),
    )
    summary = blur_summary(rows, plan, fused, skipped)
    write_whole(
        out.with_name(out.stem + ".summary.json"), json.dumps(summary, indent=1, ensure_ascii=False)
    )
    return summary


def blur_summary(
    rows: Sequence[BlurredRow], plan: BlurPlan, fused: int, skipped: int
) -> dict[str, Any]:
    """Counts (each with the n it is over) and the removed types' mix against the plan's."""
    accepted = [r for r in rows if r.accepted]
    # A row may fail one rule for several spans: each reason counts once per row.
    reasons = Counter(x for r in rows for x in dict.fromkeys(y["reason"] for y in r.rejected))
    reasons.update("model_error" for r in rows if r.error is not None)
    removed: Counter[str] = Counter(c.type for r in accepted for c in r.removed)
    drawn_types = [c.type for r in rows for c in r.targets]
    total_weight = sum(plan.mix.values())
    n_removed = sum(removed.values())
    return {
        "plan": plan.document(),
        "fused_queries": {"n": fused + skipped, "skipped_without_query": skipped},
        "variants": {
            "n": len(rows),
            "accepted": len(accepted),
            "rejected": sum(1 for r in rows if r.error is None and r.rejected),
            "failed": sum(1 for r in rows if r.error is not None),
            "short_of_per_query": fused * plan.per_query - len(rows),
        },
        "reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
        # Drawn: what the variants were asked to remove (the draw against the fused queries'
        # constraints); got: what the accepted instances removed (after the checks).
        "mix": {
            "asked": {t: round(w / total_weight, 3) for t, w in plan.mix.items()},
            "n_drawn": len(drawn_types),
            "drawn": _shares(drawn_types, plan.mix),
            "n_removed": n_removed,
            "got": _shares(list(removed.elements()), plan.mix),
            "counts": dict(removed),
        },
    }


def _shares(types: Sequence[str], mix: dict[str, float]) -> dict[str, float | None]:
    """Each of the mix's types' share of `types` (None: there are none)."""
    return {t: round(types.count(t) / len(types), 3) if types else None for t in mix}
