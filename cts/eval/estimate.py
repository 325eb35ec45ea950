"""`cts estimate`: what a whole sweep will cost, extrapolated from a pilot's records.

A pilot is a run of the experiment on a few instances, every condition and seed of each. Each
record carries its key's model calls and tokens per role (cts/eval/run/usage.py); its trace carries
the search agent's tool calls. An estimate is made in three parts, each in its own module:
reading the pilot (cts/eval/pilot_records.py: its records, the attempts they replaced,
unrecorded/, traces and dialogues), the arithmetic (cts/eval/cost.py: each key's figures, their
extrapolation to the sweep with a bootstrap interval over the pilot's instances, hours and
shards) and the notes a reader needs (cts/eval/estimate_notes.py). This module puts them
together: `estimate` from records already read, `estimate_run` from a run directory, both into
an `Estimate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cts.eval.cost import (
    RESAMPLES,
    ConditionRow,
    Figure,
    HeldServers,
    ModelRow,
    RoleRow,
    ToolRow,
    check_target_hours,
    condition_rows,
    extrapolate,
    held_servers,
    keyed_figures,
    model_rows,
    role_rows,
    tool_rows,
)
from cts.eval.data.schema import Record
from cts.eval.estimate_notes import (
    estimate_notes,
    model_changes,
    not_drawn,
    unloadable_config,
    unread_traces,
)
from cts.eval.pilot import read_draw
from cts.eval.pilot_records import (
    DialogueKey,
    attempts,
    count_pilot,
    read_traces,
    sweep_size,
    unrecorded_attempts,
)
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.dialogue import LineUsage, asked_per_dialogue
from cts.eval.run.run_dir import RunDir
from cts.foundation.yaml_config import ConfigError


@dataclass(frozen=True)
class Estimate:
    experiment: str
    pilot_dir: str
    pilot_instances: int
    pilot_keys: int
    pilot_failed: int
    sweep_instances: int
    conditions: list[str]
    seeds: list[int]
    sweep_keys: int
    roles: list[RoleRow]
    models: list[ModelRow]
    by_condition: list[ConditionRow]
    tools: list[ToolRow]
    #: All roles together (None: the pilot's records do not say).
    calls: Figure | None
    prompt_tokens: Figure | None
    completion_tokens: Figure | None
    target_hours: float
    #: The suggested `--shards`: the most any model with a known throughput needs.
    shards: int | None
    notes: list[str] = field(default_factory=list)
    #: How the pilot's instances were chosen (cts/eval/pilot.py), or that a run was read as it is.
    pilot_drawn: str = ""
    #: Records of the pilot replaced by a later one of their key (a failure retried with
    #: `--retry-failed`, a key recorded again on a resume): their model work is counted.
    pilot_replaced: int = 0
    #: Per model, GPU-hours held at the suggested shards: per-task servers against shared ones.
    held: list[HeldServers] = field(default_factory=list)
    #: Keys of the pilot the run stopped before their record (then resumed): their model
    #: calls, kept in unrecorded/, are counted.
    pilot_unrecorded: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(
    records: Sequence[Record],
    traces: Mapping[str, Mapping[str, Any]],
    sweep: ResolvedExperiment,
    sweep_instances: int,
    *,
    source: str,
    target_hours: float = 24.0,
    resamples: int = RESAMPLES,
    replaced: Sequence[Record] = (),
    unrecorded: Sequence[Record] = (),
    dialogues: Mapping[DialogueKey, Sequence[LineUsage | None]] | None = None,
) -> Estimate:
    """The sweep of `sweep` (its conditions and seeds on `sweep_instances` instances)
    extrapolated from the pilot's `records` and their `traces` (by trace id). The model work
    of `replaced` records (earlier attempts of a key, see `attempts`) and of `unrecorded` ones
    (what a key had done when the run stopped before its record) is added to their key's: a
    sweep pays for its retries too, and a resumed pilot counts what an uninterrupted one
    would. Their tool calls are not known (a retry's trace takes the place of the attempt's).
    `dialogues` (`asked_per_dialogue`) gives each sequential dialogue's calls line by line:
    where every line of one records them, they replace its keys' share (`with_dialogues`)."""
    check_target_hours(target_hours)
    p = count_pilot(records, sweep, source, replaced, unrecorded, dialogues or {})
    max_queries = sweep.experiment.search.max_queries
    keyed = keyed_figures(p.work.records, traces, p.roles, max_queries, p.metered, p.work.added)
    keys_per_instance = len(p.conditions) * len(p.seeds)
    x = extrapolate(p.complete, keyed, keys_per_instance, sweep_instances, resamples)
    models = model_rows(x, sweep, p.roles, target_hours, sweep_instances)
    tools = tool_rows(x, sweep, p.records, keyed)
    known = [m.shards for m in models if m.shards is not None]
    per_condition = sweep_instances * len(p.seeds)
    return Estimate(
        experiment=sweep.experiment.name,
        pilot_dir=source,
        pilot_instances=len(p.complete),
        pilot_keys=len(p.complete) * keys_per_instance,
        pilot_failed=sum(r.error is not None for r in p.records),
        sweep_instances=sweep_instances,
        conditions=p.conditions,
        seeds=p.seeds,
        sweep_keys=sweep_instances * keys_per_instance,
        roles=role_rows(x, sweep, p.roles, p.records, keyed),
        models=models,
        by_condition=condition_rows(p.conditions, p.records, keyed, per_condition, p.metered),
        tools=tools,
        calls=x.figure("all:calls") if p.metered else None,
        prompt_tokens=x.figure("all:prompt_tokens") if p.metered else None,
        completion_tokens=x.figure("all:completion_tokens") if p.metered else None,
        target_hours=target_hours,
        shards=max(known) if known else None,
        notes=estimate_notes(sweep, p, keyed, models, tools),
        pilot_replaced=len(p.replaced),
        held=held_servers(models, max(known), target_hours) if known else [],
        pilot_unrecorded=len(p.unrecorded),
    )


def estimate_run(
    run_dir: Path,
    sweep: ResolvedExperiment,
    target_hours: float = 24.0,
    sweep_instances: int | None = None,
) -> Estimate:
    """The sweep of `sweep` extrapolated from the records and traces of the finished run (or
    pilot) in `run_dir`. RunDirError without a run there, PilotError without the keys."""
    run = RunDir(run_dir)
    try:
        ran: ResolvedExperiment | None = run.read_config()
    except ConfigError as e:
        # The records still count; only the models they were made with cannot be compared.
        ran, unreadable = None, str(e).splitlines()[-1]
    records, replaced = attempts(run_dir)
    traces, unread = read_traces(run_dir, records)
    found = estimate(
        records,
        traces,
        sweep,
        sweep_size(sweep) if sweep_instances is None else sweep_instances,
        source=str(run_dir),
        target_hours=target_hours,
        replaced=replaced,
        unrecorded=unrecorded_attempts(run_dir),
        dialogues=asked_per_dialogue(run.dialogues),
    )
    found = replace(found, pilot_drawn=read_draw(run_dir) or not_drawn(run_dir))
    extra = (
        model_changes(ran, sweep)
        if ran is not None
        else [unloadable_config(run.config, unreadable)]
    )
    found.notes.extend(extra + unread_traces(unread))
    return found
