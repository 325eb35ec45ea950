"""The notes of `cts estimate`: what a reader must know to trust its figures as far as they go
(a short pilot, failures, cached and replayed calls, unknown hours and prices, retried,
unrecorded and unread work, roles the pilot ran on other models), as sentences.

Apart from the arithmetic (cts/eval/cost.py) and from reading the pilot
(cts/eval/pilot_records.py): these change with what an estimate says to its reader, not with
how it counts; every sentence of an estimate is here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from cts.eval.cost import ModelRow, RecordKey, ToolRow
from cts.eval.data.schema import Record
from cts.eval.pilot_records import CountedPilot
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.pipeline import clarify_turns
from cts.eval.run.usage import role_usage

#: The notes on records the pilot's account holds beside its final ones: {calls} is filled in.
_REPLACED = (
    "{n} record(s) of the pilot were replaced by a later attempt of their key (--retry-failed, "
    "or a resume): their {calls} model call(s) and tokens are counted in their keys, their tool "
    "calls are not (the retry's trace took the place of theirs)"
)
_UNRECORDED = (
    "the pilot was stopped and resumed: {n} key(s) in flight had made {calls} model call(s) "
    "(kept in unrecorded/), counted in their keys, as their rerun found those answers in the "
    "pilot's response cache; their tool calls are not known (tool calls the rerun replayed are "
    "not counted)"
)


def estimate_notes(
    sweep: ResolvedExperiment,
    pilot: CountedPilot,
    keyed: Mapping[RecordKey, Mapping[str, float]],
    models: list[ModelRow],
    tools: list[ToolRow],
) -> list[str]:
    """The notes of an estimate of `sweep` from `pilot`, its keys' figures (`keyed`) and the
    rows of its models and tools."""
    return (
        _notes_on_records(pilot, keyed)
        + _notes_on_figures(sweep, models, tools)
        + _extra_note(_REPLACED, pilot.work.stripped(pilot.replaced), pilot.roles, pilot.metered)
        + _extra_note(
            _UNRECORDED, pilot.work.stripped(pilot.unrecorded), pilot.roles, pilot.metered
        )
        + _auto_replicas_note(sweep, models)
    )


def _notes_on_records(
    pilot: CountedPilot, keyed: Mapping[RecordKey, Mapping[str, float]]
) -> list[str]:
    """What the pilot's records leave out: instances, per-role usage, failures, cached calls."""
    notes = []
    if len(pilot.complete) < 2:
        notes.append("a pilot of 1 instance gives no interval: pilot more (--pilot N)")
    if pilot.incomplete:
        notes.append(
            f"{pilot.incomplete} instance(s) of the pilot miss some keys and were left out"
        )
    if not pilot.metered:
        notes.append(
            "the pilot's records were made before each role's calls were recorded: only the "
            "searcher's are known (from the traces); run a new pilot for every role"
        )
    failed = sum(r.error is not None for r in pilot.records)
    if failed:
        notes.append(
            f"{failed} of the pilot's {len(pilot.records)} keys failed; their calls count, and a "
            "failed key usually stops early, so a sweep with fewer failures costs more"
        )
    requests = sum(v.get("all:calls", 0) + v.get("all:cached_calls", 0) for v in keyed.values())
    cached = sum(v.get("all:cached_calls", 0) for v in keyed.values())
    if cached:
        notes.append(
            f"{cached:.0f} of the pilot's {requests:.0f} model requests were answered by the "
            "response cache (a request another key made too, or an earlier run's): they count "
            "as no model work"
        )
    return notes


def _notes_on_figures(
    sweep: ResolvedExperiment, models: list[ModelRow], tools: list[ToolRow]
) -> list[str]:
    """What the figures leave out or cannot say: replayed tool calls, the turns a shared
    dialogue counts under one condition, hours without a throughput, calls without a price."""
    notes = []
    replayed = sum(t.pilot_replayed for t in tools)
    if replayed:
        notes.append(
            f"{replayed} tool call(s) of the pilot were replayed from the tool cache: not "
            "counted (nor the summarizer calls of replayed visits)"
        )
    clarify = [c for c in sweep.experiment.conditions if clarify_turns(c) is not None]
    if len(clarify) > 1 and sweep.experiment.clarification.mode == "sequential":
        notes.append(
            f"{', '.join(clarify)} share one dialogue per instance and seed, each turn "
            "counted under the first of them that asks it: their per-condition calls are "
            "uneven, the totals are not"
        )
    unknown = [m.model for m in models if m.throughput_tokens_per_s is None]
    if unknown:
        notes.append(
            f"hours unknown for {', '.join(unknown)}: set throughput_tokens_per_s in its "
            "model config (generated tokens/s of one server under a run's load: measure it "
            "with bench/pipeline.py, or from the server's log during a pilot on your GPU)"
        )
    unpriced = [t.tool for t in tools if t.price is None and t.calls.total]
    if unpriced:
        notes.append(
            f"no API cost for {' and '.join(unpriced)}: set search.price_per_call / "
            "search.price_per_visit (USD) for a paid backend"
        )
    return notes


def _calls_of(records: Sequence[Record], roles: Mapping[str, str], metered: bool) -> int:
    """The model calls of `records` in the roles shown."""
    return sum(
        used.calls
        for r in records
        for role in roles
        if (used := role_usage(r.usage, role) if metered else None) is not None
    )


def _extra_note(
    text: str, records: list[Record], roles: Mapping[str, str], metered: bool
) -> list[str]:
    """`text` about `records` (replaced or unrecorded ones), if there are any."""
    if not records:
        return []
    return [text.format(n=len(records), calls=_calls_of(records, roles, metered))]


def _auto_replicas_note(sweep: ResolvedExperiment, models: Sequence[ModelRow]) -> list[str]:
    """Models whose servers per shard the config leaves to the node (`replicas: auto`)."""
    auto = [m.model_name for m in models if sweep.model_configs[m.model].vllm.replicas == "auto"]
    if not auto:
        return []
    return [
        f"vllm.replicas is auto for {', '.join(auto)}: counted as one server per shard (the "
        "copies that fit depend on the node); set a number for shards and held GPU-hours "
        "that count them"
    ]


# -- the run read -----------------------------------------------------------------------------


def model_changes(pilot: ResolvedExperiment, sweep: ResolvedExperiment) -> list[str]:
    """Roles the pilot ran on another model than the sweep names: their figures are the
    pilot's model's."""
    changed = []
    for role, config in sweep.experiment.roles.items():
        ran = pilot.experiment.roles.get(role)
        if ran is None:
            continue
        before, after = pilot.model_for(role).name, sweep.model_for(role).name
        if before != after:
            changed.append(
                f"roles.{role}: the pilot ran it on {before}, the sweep on {after} "
                f"({config.model}): its figures are {before}'s"
            )
    return changed


def unloadable_config(config: Path, unreadable: str) -> str:
    """The note on a run whose config.yaml does not load (`unreadable`: why)."""
    return f"{config} does not load ({unreadable}): its models are not compared"


def unread_traces(unread: int) -> list[str]:
    """The note on traces that could not be read, if any."""
    if not unread:
        return []
    return [f"{unread} trace(s) could not be read: their tool calls are not counted"]


def not_drawn(run_dir: Path) -> str:
    """How the instances of a run not drawn by `cts estimate` were chosen."""
    return (
        f"the instances of {run_dir} as it ran them (not drawn by `cts estimate`: they may "
        "not represent the sweep's languages and constraint types)"
    )
