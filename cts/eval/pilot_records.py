"""What `cts estimate` reads of a pilot (or a finished run): its records and the attempts they
replaced, unrecorded/, its traces, its dialogues' lines, the sweep's size, and which of the
pilot's instances, keys and roles an estimate stands on.

Work the pilot's own records do not hold is counted where it is kept: a sequential dialogue's
calls from its lines in dialogues/ (each call on one line, whichever key took the turn, recorded
or not), and the calls of a key the run stopped before its record from unrecorded/ (its rerun on
resume finds them in the pilot's response cache, answered for no work). A resumed pilot then
counts what an uninterrupted one would.

Apart from the arithmetic (cts/eval/cost.py): this changes with a run directory's files and
what its records hold, not with how a sweep's cost is counted from them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cts.eval.data.dataset import load_instances
from cts.eval.data.schema import Record
from cts.eval.experiment import CLARIFY_ROLES, SEARCH_ROLES
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.dialogue import LineUsage
from cts.eval.run.pipeline import clarify_turns
from cts.eval.run.records import RecordStore, UnrecordedStore, counts_over
from cts.eval.run.run_dir import RunDir, RunDirError
from cts.eval.run.traces import inside, read_trace_file
from cts.eval.run.usage import ROLE_FIGURES, role_usage

#: The roles a sequential dialogue's own task calls (cts/eval/run/dialogue.py): where its lines
#: record their calls, those count, and the records' share of them (the turns their keys
#: took) does not.
DIALOGUE_ROLES = ("clarifier", "user_answerer", "question_classifier")
_DIALOGUE_USAGE = frozenset(f"{role}_{name}" for role in DIALOGUE_ROLES for name in ROLE_FIGURES)

#: A dialogue's key: (instance id, seed).
DialogueKey = tuple[str, int]


class PilotError(RunDirError):
    """A run directory whose records cannot give an estimate (exit 2, as a bad run dir)."""


# -- what the run directory holds -------------------------------------------------------------


def attempts(run_dir: Path) -> tuple[list[Record], list[Record]]:
    """The record that counts for each key of a run (`counts_over`), and every other record
    of its files: earlier attempts a retry or a resume replaced, whose work was done."""
    store = RecordStore(run_dir)
    counted: dict[tuple[str, str, int], Record] = {}
    everything: list[Record] = []
    for path in store.all_files():
        for record in store.read(path):
            everything.append(record)
            counted[record.key] = counts_over(counted.get(record.key), record)
    kept = {id(r) for r in counted.values()}
    return list(counted.values()), [r for r in everything if id(r) not in kept]


def unrecorded_attempts(run_dir: Path) -> list[Record]:
    """What each key the run stopped before its record had done (cts/eval/run/runner.py
    UnrecordedStore): model work its rerun found cached."""
    store = UnrecordedStore(run_dir)
    return [record for path in store.all_files() for record in store.read(path)]


def read_traces(run_dir: Path, records: Sequence[Record]) -> tuple[dict[str, dict[str, Any]], int]:
    """The traces the records name, by trace id, and how many could not be read (missing,
    unreadable, or a path leaving the run's traces/)."""
    traces_dir = RunDir(run_dir).traces
    found: dict[str, dict[str, Any]] = {}
    unread = 0
    for r in records:
        if not r.trace_id or r.trace_id in found:
            continue
        path = inside(traces_dir, r.trace_id)
        loaded = read_trace_file(path)[0] if path is not None else None
        if loaded is None:
            unread += 1
            continue
        found[r.trace_id] = loaded
    return found, unread


def sweep_size(resolved: ResolvedExperiment) -> int:
    """The instances `cts run -c X` would run: the dataset, with its `limit`."""
    return len(load_instances(resolved.experiment.dataset))


# -- the pilot's keys and roles ---------------------------------------------------------------


def pilot_instances(
    records: Sequence[Record], conditions: Sequence[str], seeds: Sequence[int], source: str
) -> tuple[dict[str, list[Record]], int]:
    """The pilot's instances that hold every key of the sweep (condition × seed), with their
    records, and how many instances were left out for missing some. PilotError when a
    condition or seed of the sweep has no record at all, or no instance is complete."""
    wanted = {(c, s) for c in conditions for s in seeds}
    keyed: dict[str, dict[tuple[str, int], Record]] = defaultdict(dict)
    for r in records:
        if (r.condition, r.seed) in wanted:
            keyed[r.instance_id][(r.condition, r.seed)] = r
    held = {key for keys in keyed.values() for key in keys}
    missing = sorted({c for c, _ in wanted if not any(h[0] == c for h in held)})
    missing_seeds = sorted({s for _, s in wanted if not any(h[1] == s for h in held)})
    if missing or missing_seeds:
        what = ", ".join([*missing, *(f"seed {s}" for s in missing_seeds)])
        raise PilotError(
            f"{source}: no records of {what}, which the sweep runs (conditions "
            f"{', '.join(conditions)}; seeds {', '.join(map(str, seeds))}): estimate from a "
            "pilot of the same experiment"
        )
    complete = {i: list(keys.values()) for i, keys in keyed.items() if set(keys) == wanted}
    if not complete:
        raise PilotError(
            f"{source}: no instance has a record for every condition and seed of the sweep "
            f"({len(wanted)} keys each): finish the pilot first (run the same command again)"
        )
    return complete, len(keyed) - len(complete)


def roles_shown(sweep: ResolvedExperiment, pilot_roles: set[str]) -> list[str]:
    """The roles the sweep's conditions use, in the pipeline's order, then any other role the
    pilot called."""
    experiment = sweep.experiment
    needed: list[str] = []
    if any(clarify_turns(c) is not None for c in experiment.conditions):
        clarifier, user_answerer, rewriter = CLARIFY_ROLES
        needed = [clarifier, user_answerer]
        if experiment.clarification.question_types == "llm":
            needed.append("question_classifier")
        needed.append(rewriter)
    needed.extend(SEARCH_ROLES)
    extra = sorted(pilot_roles - set(needed))
    return [r for r in [*needed, *extra] if r in experiment.roles]


def _pilot_roles(pilot: Sequence[Record], sweep: ResolvedExperiment) -> tuple[dict[str, str], bool]:
    """The roles an estimate shows (role → model config) and whether the pilot's records
    metered per-role usage at all."""
    all_roles = {str(role): rc.model for role, rc in sweep.experiment.roles.items()}
    metered = any(role_usage(r.usage, role) is not None for r in pilot for role in all_roles)
    called = {
        role
        for r in pilot
        for role in all_roles
        if (used := role_usage(r.usage, role)) is not None and used.calls + used.cached_calls
    }
    shown = roles_shown(sweep, called)
    return {role: all_roles[role] for role in shown}, metered


@dataclass(frozen=True)
class PilotWork:
    """The pilot's records as the estimate counts them, and the work added to their keys."""

    records: list[Record]
    added: list[Record]
    #: Dialogues whose calls are counted from their lines (their keys' share is not).
    from_lines: frozenset[DialogueKey]

    def stripped(self, records: Sequence[Record]) -> list[Record]:
        return _stripped(records, self.from_lines)


def _stripped(records: Sequence[Record], from_lines: frozenset[DialogueKey]) -> list[Record]:
    """`records`, those of a dialogue counted from its lines without the dialogue's calls."""
    return [_without_dialogue(r) if _dialogue_of(r) in from_lines else r for r in records]


def _dialogue_of(record: Record) -> DialogueKey | None:
    """The sequential dialogue a clarify@k record took turns of; None for other conditions."""
    if clarify_turns(record.condition) is None:
        return None
    return (record.instance_id, record.seed)


def _without_dialogue(record: Record) -> Record:
    """`record` without the dialogue roles' calls (its turns, counted from the lines)."""
    usage = {k: v for k, v in record.usage.items() if k not in _DIALOGUE_USAGE}
    return record.model_copy(update={"usage": usage})


def with_dialogues(
    pilot: Sequence[Record],
    added: Sequence[Record],
    dialogues: Mapping[DialogueKey, Sequence[LineUsage | None]],
    conditions: Sequence[str],
) -> PilotWork:
    """The pilot's records and the attempts added to their keys, with each dialogue whose
    every line records its calls counted from those lines: turn j under the sweep's first
    clarify@k with k ≥ j (turns no condition of the sweep asks are left out), and not in the
    records, whose keys took only the turns they reached — none, if their dialogue was read
    back from an earlier session. Other dialogues (lines of older runs) count from records."""
    pilot_dialogues = {d for r in pilot if (d := _dialogue_of(r)) is not None}
    from_lines = frozenset(
        d
        for d in pilot_dialogues
        if dialogues.get(d) and all(line is not None for line in dialogues[d])
    )
    ks = sorted((k, c) for c in conditions if (k := clarify_turns(c)) is not None)
    lines = [
        Record(instance_id=instance_id, condition=condition, seed=seed, usage=line.roles)
        for (instance_id, seed) in sorted(from_lines)
        for line in dialogues[(instance_id, seed)]
        if line is not None
        and (condition := next((c for k, c in ks if k >= line.turn), None)) is not None
    ]
    return PilotWork(
        _stripped(pilot, from_lines), [*_stripped(added, from_lines), *lines], from_lines
    )


# -- the pilot as an estimate counts it -------------------------------------------------------


@dataclass(frozen=True)
class CountedPilot:
    """The pilot's instances that hold every key of the sweep, and their keys' work as the
    estimate counts it."""

    #: The sweep's conditions and seeds: the keys every instance of `complete` has.
    conditions: list[str]
    seeds: list[int]
    #: instance id → its records, one per key.
    complete: dict[str, list[Record]]
    #: Instances of the pilot left out for missing some key.
    incomplete: int
    #: The records of `complete`, instance by instance.
    records: list[Record]
    #: The roles an estimate shows (role → model config), and whether the records metered
    #: per-role usage at all.
    roles: dict[str, str]
    metered: bool
    #: The attempts of these keys a later record replaced, and what keys had done when the
    #: run stopped before their record: their model work is added to their keys'.
    replaced: list[Record]
    unrecorded: list[Record]
    work: PilotWork


def count_pilot(
    records: Sequence[Record],
    sweep: ResolvedExperiment,
    source: str,
    replaced: Sequence[Record],
    unrecorded: Sequence[Record],
    dialogues: Mapping[DialogueKey, Sequence[LineUsage | None]],
) -> CountedPilot:
    """The pilot of `records` (read from `source`) for the sweep of `sweep`: its complete
    instances (`pilot_instances`), its roles, and the `replaced` and `unrecorded` attempts of
    its keys, with each dialogue counted from its lines where they all say (`with_dialogues`)."""
    experiment = sweep.experiment
    conditions = [str(c) for c in experiment.conditions]
    seeds = list(experiment.seeds)
    complete, incomplete = pilot_instances(records, conditions, seeds, source)
    pilot = [r for rs in complete.values() for r in rs]
    roles, metered = _pilot_roles(pilot, sweep)
    pilot_keys = {r.key for r in pilot}
    counted = [r for r in replaced if r.key in pilot_keys]
    stopped = [r for r in unrecorded if r.key in pilot_keys]
    work = with_dialogues(pilot, [*counted, *stopped], dialogues, conditions)
    return CountedPilot(
        conditions, seeds, complete, incomplete, pilot, roles, metered, counted, stopped, work
    )
