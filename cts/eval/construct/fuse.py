"""`cts data fuse`: a raw search log's query groups (one user's session: fragments and
reformulations) into one intent query each, the `fused_query` of a benchmark instance, by the
experiment's `fuser` role (cts/agents/fuser.py), with the constraints it states and where the row
came from (model, prompt digest, seed).

The raw file is JSONL, a query a line: `{"query": ..., "group": ..., "language": ...}`. Lines
of one `group` form one session (in file order); a line without `group` is a session of its
own, `line-<n>` (a file that also names a group so is refused: the two would merge). Other
fields (a timestamp, the shipped sample's `intent`) are kept out of the fuser's sight."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from cts.agents import fuser
from cts.agents.fuser import StatedConstraint
from cts.agents.prompts import prompt_language
from cts.eval.construct.store import (
    BuildControl,
    BuildOutcome,
    BuildRow,
    RowStore,
    check_settings,
    digest,
    run_rows,
)
from cts.eval.data.readers import DatasetError
from cts.eval.data.schema import known_language, normal_form, unsafe_id
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import Role
from cts.eval.run.engines import open_engines
from cts.foundation.disk import write_whole
from cts.serving.engine import ChatModel
from cts.serving.errors import EngineError
from cts.serving.model_config import model_label
from cts.webdancer.corpus import Problem


@dataclass(frozen=True)
class RawGroup:
    id: str
    language: str
    queries: tuple[str, ...]
    #: The file's line of each query.
    lines: tuple[int, ...]


class _RawLine(BaseModel):
    query: str
    group: str | None = None
    language: str = "en"


def read_raw(path: Path) -> list[RawGroup]:
    """The sessions of a raw query file, in the order they first appear; DatasetError naming
    `file:line: field` for every bad line (not JSON, no query, a group of two languages, a
    line without a group whose session a named group would take in)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError([Problem(str(path), None, "<file>", f"cannot read: {e}")]) from e
    groups: dict[str, list[tuple[int, _RawLine]]] = {}
    problems: list[Problem] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        found = _raw_line(path, n, line, problems)
        if found is not None:
            groups.setdefault(found.group or f"line-{n}", []).append((n, found))
    problems += _group_problems(path, groups)
    if not groups and not problems:
        problems.append(Problem(str(path), None, "<file>", "no raw query"))
    if problems:
        raise DatasetError(problems)
    return [
        RawGroup(
            gid, rows[0][1].language, tuple(r.query for _, r in rows), tuple(n for n, _ in rows)
        )
        for gid, rows in groups.items()
    ]


def _group_problems(path: Path, groups: dict[str, list[tuple[int, _RawLine]]]) -> list[Problem]:
    """A group that cannot name its instances, mixes languages, or would take in a line
    without a group."""
    problems = []
    for gid, rows in groups.items():
        # A line without a group is the session `line-<n>`: refused, not merged into it, when
        # the file also names a group so.
        alone = [n for n, r in rows if r.group is None]
        named = [n for n, r in rows if r.group is not None]
        if alone and named:
            problems.append(
                Problem(
                    str(path),
                    alone[0],
                    "group",
                    f"missing: the line's own session would be {gid!r}, the group line "
                    f"{named[0]} names; give this line a group",
                )
            )
        # The group names its instances (`<group>-b<variant>`): refused here, not at the end.
        why = unsafe_id(f"{gid}-b0")
        if why is not None:
            problems.append(Problem(str(path), rows[0][0], "group", f"{gid!r} {why}"))
        languages = {prompt_language(r.language) for _, r in rows}
        if len(languages) > 1:
            problems.append(
                Problem(str(path), rows[-1][0], "language", f"group {gid!r} mixes languages")
            )
    return problems


def _raw_line(path: Path, n: int, line: str, problems: list[Problem]) -> _RawLine | None:
    try:
        data = json.loads(line)
    except ValueError as e:
        problems.append(Problem(str(path), n, "<line>", f"not JSON: {e}"))
        return None
    if not isinstance(data, dict):
        problems.append(Problem(str(path), n, "<line>", "not a JSON object"))
        return None
    try:
        raw = _RawLine.model_validate(
            {k: data[k] for k in ("query", "group", "language") if k in data}
        )
    except ValidationError as e:
        error = e.errors()[0]
        problems.append(Problem(str(path), n, str(error["loc"][0]), error["msg"]))
        return None
    if not raw.query.strip():
        problems.append(Problem(str(path), n, "query", "empty"))
    elif not known_language(raw.language):
        problems.append(Problem(str(path), n, "language", f"unknown language {raw.language!r}"))
    else:
        return raw
    return None


class Provenance(BaseModel):
    """Where a built row came from."""

    role: str
    #: The role's model, as reports name it.
    model: str
    #: sha256 of the role's prompt file (both languages), as this version ships it.
    prompt: str
    seed: int


class FusedRow(BuildRow):
    """One line of `cts data fuse`'s output: the key is the raw group's id."""

    language: str
    raw_queries: list[str]
    fused_query: str = ""
    #: The constraints the fused query states, each span in it.
    constraints: list[StatedConstraint] = Field(default_factory=list)
    #: Constraints the model listed whose span is not in its query (dropped, kept for review).
    dropped: list[StatedConstraint] = Field(default_factory=list)
    provenance: Provenance


def prompt_digest(role: str) -> str:
    text = resources.files("cts.agents").joinpath("prompts", f"{role}.yaml").read_bytes()
    return hashlib.sha256(text).hexdigest()


def provenance(
    resolved: ResolvedExperiment, role: Role, seed: int, prompt: str | None = None
) -> Provenance:
    """`role`'s model and its prompt (`prompt`: another prompt file the role is asked with)."""
    model = model_label(resolved.experiment.roles[role].model, resolved.model_for(role).name)
    return Provenance(role=role, model=model, prompt=prompt_digest(prompt or role), seed=seed)


def stated(
    query: str, constraints: list[StatedConstraint]
) -> tuple[list[StatedConstraint], list[StatedConstraint]]:
    """The constraints whose span is in `query` (in `normal_form`; duplicates once), each with
    its span as `query` writes it (a blur removes that text, and over-answer scoring looks for
    it verbatim), and the others."""
    kept: dict[str, StatedConstraint] = {}
    dropped = []
    for c in constraints:
        verbatim = verbatim_span(query, c.span)
        if verbatim is None:
            dropped.append(c)
        else:
            kept.setdefault(normal_form(verbatim), StatedConstraint(type=c.type, span=verbatim))
    return list(kept.values()), dropped


def verbatim_span(query: str, span: str) -> str | None:
    """The first text of `query` that is `span` in `normal_form` (width, case and whitespace
    folded), as `query` writes it; None when there is none."""
    if span in query:
        return span
    wanted = normal_form(span)
    if not wanted or wanted not in normal_form(query):
        return None
    for start in range(len(query)):
        if query[start].isspace():
            continue
        # One more character never makes the folded text shorter (a combining mark composes
        # with the character before it): once longer than the span, no later end matches.
        for end in range(start + 1, len(query) + 1):
            found = normal_form(query[start:end])
            if found == wanted:
                return query[start:end]
            if len(found) > len(wanted):
                break
    return None


async def fuse_group(
    engine: ChatModel, group: RawGroup, resolved: ResolvedExperiment, seed: int
) -> FusedRow:
    """One session fused (a failed model call is the row's error)."""
    made = provenance(resolved, "fuser", seed)
    row = FusedRow(
        key=group.id, language=group.language, raw_queries=list(group.queries), provenance=made
    )
    sampling = resolved.sampling_for("fuser").with_seed(seed)
    try:
        intent = await fuser.fuse(engine, group.queries, group.language, sampling)
    except (EngineError, ValidationError) as e:
        return row.model_copy(update={"error": f"{type(e).__name__}: {e}"[:500]})
    kept, dropped = stated(intent.query, intent.constraints)
    return row.model_copy(
        update={"fused_query": intent.query, "constraints": kept, "dropped": dropped}
    )


def fuse_file(
    resolved: ResolvedExperiment, raw: Path, out: Path, control: BuildControl, seed: int = 0
) -> tuple[BuildOutcome, int | None]:
    """Fuse (the shard's share of) `raw`'s groups, resuming from the rows under `<out>.parts/`
    (SettingsChanged when they were made from other raw queries, another seed, model or
    prompt); when every group has a row, `out` gets them all, in the file's order. Returns the
    outcome and how many of `out`'s rows are fused queries, not failures (None: not written
    yet, rows are missing)."""
    groups = read_raw(raw)
    store = RowStore(parts_dir(out), FusedRow)
    by_id = {g.id: g for g in groups}
    made = provenance(resolved, "fuser", seed)
    settings = {
        "seed": seed,
        "raw_queries": digest([[g.id, g.language, g.queries] for g in groups]),
        "fuser": made.model_dump(exclude={"role", "seed"}),
    }
    check_settings(store.root, settings, "fused")

    @asynccontextmanager
    async def fusing() -> AsyncIterator[Callable[[str], Awaitable[FusedRow]]]:
        async with open_engines(resolved, ["fuser"]) as engines:
            engine = engines.roles["fuser"]
            yield lambda key: fuse_group(engine, by_id[key], resolved, seed)

    outcome = asyncio.run(run_rows(store, list(by_id), fusing, control))
    return outcome, write_rows(store, list(by_id), out)


def parts_dir(out: Path) -> Path:
    """Where a step writing `out` keeps its shard files."""
    return out.with_name(out.name + ".parts")


def write_rows(store: RowStore[Any], keys: list[str], out: Path) -> int | None:
    """Every key's row, in `keys`' order, into `out` once all have one; how many of them are
    not failures (None: not written, rows are missing)."""
    rows = store.rows()
    if any(k not in rows for k in keys):
        return None
    text = "".join(rows[k].model_dump_json() + "\n" for k in keys)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_whole(out, text)  # whole or absent, as every other output
    return sum(1 for k in keys if rows[k].error is None)
