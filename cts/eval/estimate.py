"""`cts estimate`: what a whole sweep will cost, extrapolated from a pilot's records.

A pilot is a run of the experiment on a few instances, every condition and seed of each. Each
record carries its key's model calls and tokens per role (cts/eval/run/usage.py); its trace carries
the search agent's tool calls. A figure of the sweep is the pilot's mean per instance (its keys
summed) times the sweep's instances — the same as each condition's per-key mean times that
condition's keys in the sweep, since every pilot instance has every key. Summing per instance
first keeps the keys of one instance together: they share a dialogue and a query, so they are
not independent draws. The interval is a 95% percentile bootstrap over the pilot's instances:
with five instances it is rough, and it says only how much the pilot's instances differ.

Work the pilot's own records do not hold is counted where it is kept: a sequential dialogue's
calls from its lines in dialogues/ (each call on one line, whichever key took the turn, recorded
or not), and the calls of a key the run stopped before its record from unrecorded/ (its rerun on
resume finds them in the pilot's response cache, answered for no work). A resumed pilot then
counts what an uninterrupted one would.

Server-hours divide a model's generated tokens by its `throughput_tokens_per_s` (a figure
measured under a pipeline's load, prefill included); GPU-hours multiply by the GPUs one server
spans. A model served with `vllm.replicas: r` runs r servers in every shard: its shards are
those of r servers' throughput, and each shard holds r × its GPUs. Without a throughput the
hours are unknown, never guessed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from cts.eval.data.dataset import load_instances
from cts.eval.data.schema import Record
from cts.eval.experiment import CLARIFY_ROLES, SEARCH_ROLES
from cts.eval.pilot import read_draw
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.dialogue import LineUsage, asked_per_dialogue
from cts.eval.run.pipeline import clarify_turns
from cts.eval.run.run_dir import RunDir, RunDirError
from cts.eval.run.runner import RecordStore, UnrecordedStore, counts_over
from cts.eval.run.traces import inside, read_trace_file
from cts.eval.run.usage import ROLE_FIGURES, RoleUsage, role_usage
from cts.serving.yaml_config import ConfigError

#: Bootstrap resamples of the pilot's instances (a fixed seed: the same pilot, the same
#: interval).
RESAMPLES = 2000
BOOTSTRAP_SEED = 0

#: Per role, the figures a table shows.
ROLE_COLUMNS = ("calls", "cached_calls", "prompt_tokens", "completion_tokens")

#: The roles a sequential dialogue's own task calls (cts/eval/run/dialogue.py): where its lines
#: record their calls, those count, and the records' share of them (the turns their keys
#: took) does not.
DIALOGUE_ROLES = ("clarifier", "user_answerer", "question_classifier")
_DIALOGUE_USAGE = frozenset(f"{role}_{name}" for role in DIALOGUE_ROLES for name in ROLE_FIGURES)

#: A dialogue's key: (instance id, seed).
DialogueKey = tuple[str, int]


class PilotError(RunDirError):
    """A run directory whose records cannot give an estimate (exit 2, as a bad run dir)."""


@dataclass(frozen=True)
class Figure:
    """One quantity: the pilot's mean per key, the sweep's total, and the total's 95% interval
    (a bootstrap over the pilot's instances)."""

    per_key: float
    total: float
    low: float
    high: float

    def scaled(self, factor: float) -> Figure:
        return Figure(
            self.per_key * factor, self.total * factor, self.low * factor, self.high * factor
        )


@dataclass(frozen=True)
class RoleRow:
    role: str
    #: The model config the role names in the sweep, and its served name.
    model: str
    model_name: str
    #: None: the pilot's records do not say (made before per-role usage was recorded).
    calls: Figure | None
    prompt_tokens: Figure | None
    completion_tokens: Figure | None
    #: Requests of the pilot the response cache answered (no tokens counted for them).
    pilot_cached_calls: int


@dataclass(frozen=True)
class ModelRow:
    model: str
    model_name: str
    roles: list[str]
    completion_tokens: Figure | None
    #: Generated tokens/s of one server (the model config's `throughput_tokens_per_s`).
    throughput_tokens_per_s: float | None
    gpus_per_server: int
    server_hours: Figure | None
    #: Server-hours × GPUs per server: GPU-hours busy with the work, however many copies.
    gpu_hours: Figure | None
    #: Shards that bring this model's work under the target wall time, each running
    #: `replicas` servers of it (None: unknown).
    shards: int | None
    #: The same at the interval's upper end.
    shards_high: int | None
    #: Servers of it in every shard (`vllm.replicas`; `auto` counts as one, see the notes).
    replicas: int = 1
    #: Servers its work needs to end within the target wall time (what a shared job holds).
    servers: int | None = None

    @property
    def gpus_per_shard(self) -> int:
        return self.gpus_per_server * self.replicas


@dataclass(frozen=True)
class HeldServers:
    """GPU-hours a model's servers are held (loaded, busy or idle) over a sweep of `shards`
    shards of about `target_hours` each. Per task, every shard serves the model for its whole
    run on its `replicas` servers of `gpus_per_server` GPUs each; shared (`cts slurm submit
    --shared-servers`), one job serves it with only the servers its own work needs, for the
    same wall time."""

    model: str
    per_task_gpu_hours: float
    shared_gpu_hours: float
    replicas: int = 1
    gpus_per_server: int = 1


def held_servers(models: Sequence[ModelRow], shards: int, target_hours: float) -> list[HeldServers]:
    """Per model with a known throughput: held GPU-hours per task and shared."""
    return [
        HeldServers(
            m.model_name,
            round(shards * target_hours * m.gpus_per_shard, 2),
            round((m.servers or m.shards * m.replicas) * target_hours * m.gpus_per_server, 2),
            m.replicas,
            m.gpus_per_server,
        )
        for m in models
        if m.shards is not None
    ]


@dataclass(frozen=True)
class ConditionRow:
    condition: str
    pilot_keys: int
    sweep_keys: int
    #: Per-key means over the pilot's keys of this condition (all roles together).
    calls: float | None
    prompt_tokens: float | None
    completion_tokens: float | None
    search_calls: float
    visit_calls: float


@dataclass(frozen=True)
class ToolRow:
    #: search: one call per query a search runs; visit: one per page fetched.
    tool: str
    calls: Figure
    #: Tool calls of the pilot replayed from the tool cache (not counted in `calls`).
    pilot_replayed: int
    #: USD per call (`search.price_per_call` / `price_per_visit`); None: not configured.
    price: float | None
    cost: Figure | None


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


def shards_for(server_hours: float, target_hours: float, most: int | None = None) -> int:
    """Shards (one server of the model each) that do `server_hours` of its work in
    `target_hours` of wall time, the work split evenly: at least one, and at most `most` (the
    sweep's instances: a shard runs whole instances, so more shards would run nothing)."""
    check_target_hours(target_hours)
    needed = server_hours / target_hours  # inf for a tiny target (5e-324)
    if most is not None and not needed <= most:
        return max(1, most)
    if not math.isfinite(needed):
        raise ValueError(f"target_hours {target_hours}: too small to divide {server_hours} by")
    return max(1, math.ceil(needed))


def check_target_hours(target_hours: float) -> None:
    if not 0 < target_hours < math.inf:
        raise ValueError(f"target_hours must be a finite number of hours > 0, got {target_hours}")


# -- what one key cost ------------------------------------------------------------------------


def search_queries(arguments: Mapping[str, Any], max_queries: int) -> int:
    """Backend calls of one `search` tool call: its distinct non-empty queries, at most
    `max_queries` (cts/webdancer/tools.py runs exactly these; a malformed call runs none)."""
    value = arguments.get("query", arguments.get("queries"))
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return 0
    return min(len({str(v).strip() for v in value if str(v).strip()}), max_queries)


def tool_figures(trace: Mapping[str, Any] | None, max_queries: int) -> dict[str, float]:
    """Search and visit calls of one search run, and those replayed from the tool cache."""
    found = {"search:calls": 0.0, "search:replayed": 0.0, "visit:calls": 0.0, "visit:replayed": 0.0}
    for step in (trace or {}).get("steps", []):
        if not isinstance(step, dict) or step.get("kind") != "tool":
            continue
        tool = step.get("tool")
        if tool not in ("search", "visit"):
            continue
        if step.get("cached"):
            found[f"{tool}:replayed"] += 1
            continue
        arguments = step.get("arguments")
        if tool == "search":
            queries = search_queries(arguments if isinstance(arguments, dict) else {}, max_queries)
            found["search:calls"] += queries
        else:
            found["visit:calls"] += len(step.get("urls") or [])
    return found


def _searcher_from_trace(record: Record, trace: Mapping[str, Any] | None) -> RoleUsage:
    """The searcher's calls of a record made before per-role usage: its trace's model steps,
    else the search agent's totals in the record (which count cached calls' tokens too)."""
    steps = [s for s in (trace or {}).get("steps", []) if isinstance(s, dict)]
    llm = [s for s in steps if s.get("kind") == "llm"]
    if trace is not None:
        fresh = [s for s in llm if not s.get("cached")]
        return RoleUsage(
            calls=len(fresh),
            cached_calls=len(llm) - len(fresh),
            prompt_tokens=sum(int(s.get("prompt_tokens", 0)) for s in fresh),
            completion_tokens=sum(int(s.get("completion_tokens", 0)) for s in fresh),
        )
    usage = record.usage
    cached = usage.get("search_cached_calls", 0)
    return RoleUsage(
        calls=usage.get("search_llm_calls", 0) - cached,
        cached_calls=cached,
        prompt_tokens=usage.get("search_prompt_tokens", 0),
        completion_tokens=usage.get("search_completion_tokens", 0),
    )


def key_figures(
    record: Record,
    trace: Mapping[str, Any] | None,
    roles: Mapping[str, str],
    max_queries: int,
    metered: bool,
) -> dict[str, float]:
    """Every figure of one key: per role (`<role>:<figure>`), per model
    (`model:<ref>:completion_tokens`), all roles (`all:<figure>`) and tools. `roles` maps each
    role to its model; without `metered` records only the searcher's calls are known."""
    found = tool_figures(trace, max_queries)
    for role, model in roles.items():
        if metered:
            used = role_usage(record.usage, role) or RoleUsage()
        elif role == "searcher":
            used = _searcher_from_trace(record, trace)
        else:
            continue
        for name in ROLE_COLUMNS:
            found[f"{role}:{name}"] = getattr(used, name)
            found[f"all:{name}"] = found.get(f"all:{name}", 0) + getattr(used, name)
        key = f"model:{model}:completion_tokens"
        found[key] = found.get(key, 0) + used.completion_tokens
    return found


# -- the pilot --------------------------------------------------------------------------------


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


# -- extrapolation ----------------------------------------------------------------------------


def _bootstrap(
    per_instance: np.ndarray, sweep_instances: int, resamples: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per column of `per_instance` (instances × figures): the 2.5% and 97.5% points of the
    sweep's total over resamples of the instances."""
    n = per_instance.shape[0]
    if n < 2:
        total = per_instance.mean(axis=0) * sweep_instances
        return total, total
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    weights = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples)
    totals = weights @ per_instance / n * sweep_instances
    low, high = np.percentile(totals, [2.5, 97.5], axis=0)
    return low, high


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


#: A record's key: (instance id, condition, seed).
_Key = tuple[str, str, int]


@dataclass(frozen=True)
class _Extrapolation:
    """The pilot's figures per instance (instances × figure names) and the bootstrap interval
    of each figure's sweep total."""

    column: dict[str, int]
    per_instance: np.ndarray
    low: np.ndarray
    high: np.ndarray
    keys_per_instance: int
    sweep_instances: int

    def figure(self, name: str) -> Figure | None:
        """The named figure (per key, sweep total, interval), or None if no key has it."""
        if name not in self.column:
            return None
        j = self.column[name]
        mean = float(self.per_instance[:, j].mean())
        return Figure(
            mean / self.keys_per_instance,
            mean * self.sweep_instances,
            float(self.low[j]),
            float(self.high[j]),
        )

    def zero_or(self, name: str) -> Figure:
        return self.figure(name) or Figure(0.0, 0.0, 0.0, 0.0)


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
class _Work:
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
) -> _Work:
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
    return _Work(_stripped(pilot, from_lines), [*_stripped(added, from_lines), *lines], from_lines)


def _keyed_figures(
    pilot: Sequence[Record],
    traces: Mapping[str, Mapping[str, Any]],
    roles: Mapping[str, str],
    max_queries: int,
    metered: bool,
    counted: Sequence[Record],
) -> dict[_Key, dict[str, float]]:
    """Each pilot key's figures, with the model work of its replaced attempts (`counted`)."""
    keyed = {
        r.key: key_figures(r, traces.get(r.trace_id or ""), roles, max_queries, metered)
        for r in pilot
    }
    for r in counted:
        for name, value in key_figures(r, None, roles, max_queries, metered).items():
            keyed[r.key][name] = keyed[r.key].get(name, 0.0) + value
    return keyed


def _extrapolate(
    complete: Mapping[str, list[Record]],
    keyed: Mapping[_Key, Mapping[str, float]],
    keys_per_instance: int,
    sweep_instances: int,
    resamples: int,
) -> _Extrapolation:
    """Sum each instance's keys' figures and bootstrap the sweep's totals."""
    names = sorted({name for figures in keyed.values() for name in figures})
    column = {name: j for j, name in enumerate(names)}
    per_instance = np.zeros((len(complete), len(names)))
    for i, instance_id in enumerate(sorted(complete)):
        for r in complete[instance_id]:
            for name, value in keyed[r.key].items():
                per_instance[i, column[name]] += value
    low, high = _bootstrap(per_instance, sweep_instances, resamples)
    return _Extrapolation(column, per_instance, low, high, keys_per_instance, sweep_instances)


def _role_rows(
    x: _Extrapolation,
    sweep: ResolvedExperiment,
    roles: Mapping[str, str],
    pilot: Sequence[Record],
    keyed: Mapping[_Key, Mapping[str, float]],
) -> list[RoleRow]:
    return [
        RoleRow(
            role,
            model,
            sweep.model_configs[model].name,
            x.figure(f"{role}:calls"),
            x.figure(f"{role}:prompt_tokens"),
            x.figure(f"{role}:completion_tokens"),
            int(sum(keyed[r.key].get(f"{role}:cached_calls", 0) for r in pilot)),
        )
        for role, model in roles.items()
    ]


def _model_rows(
    x: _Extrapolation,
    sweep: ResolvedExperiment,
    roles: Mapping[str, str],
    target_hours: float,
    sweep_instances: int,
) -> list[ModelRow]:
    """Per model: generated tokens, server and GPU hours (from its throughput) and shards.
    The lexical judge is no model: it has no row."""
    model_rows = []
    for model in dict.fromkeys(roles.values()):
        config = sweep.model_configs[model]
        if config.engine == "lexical":
            continue
        generated = x.figure(f"model:{model}:completion_tokens")
        throughput = config.throughput_tokens_per_s
        hours = generated.scaled(1 / throughput / 3600) if generated and throughput else None
        gpus = config.vllm.tensor_parallel_size
        replicas = replicas_of(config.vllm.replicas)
        shards = _shards(hours, replicas, target_hours, sweep_instances) if hours else None
        model_rows.append(
            ModelRow(
                model,
                config.name,
                [role for role, m in roles.items() if m == model],
                generated,
                throughput,
                gpus,
                hours,
                hours.scaled(gpus) if hours else None,
                shards[0] if shards else None,
                shards[1] if shards else None,
                replicas,
                shards[2] if shards else None,
            )
        )
    return model_rows


def _shards(
    hours: Figure, replicas: int, target_hours: float, sweep_instances: int
) -> tuple[int, int, int]:
    """Shards for the work's `hours` and at its interval's upper end, each shard's `replicas`
    servers doing `replicas` servers' work in its wall time; and the servers the work needs
    (what a shared job holds)."""
    return (
        shards_for(hours.total / replicas, target_hours, sweep_instances),
        shards_for(hours.high / replicas, target_hours, sweep_instances),
        shards_for(hours.total, target_hours, sweep_instances * replicas),
    )


def replicas_of(replicas: int | str) -> int:
    """Servers of a model in each shard: `vllm.replicas`, where `auto` (as many as the node
    fits, unknown here) counts as one."""
    return replicas if isinstance(replicas, int) else 1


def _condition_rows(
    conditions: Sequence[str],
    pilot: Sequence[Record],
    keyed: Mapping[_Key, Mapping[str, float]],
    sweep_keys_per_condition: int,
    metered: bool,
) -> list[ConditionRow]:
    """Per condition: the per-key means over the pilot's keys of that condition."""
    by_condition = []
    for condition in conditions:
        rows = [r for r in pilot if r.condition == condition]

        def mean(name: str, rows: list[Record] = rows) -> float:
            return sum(keyed[r.key].get(name, 0.0) for r in rows) / len(rows)

        by_condition.append(
            ConditionRow(
                condition,
                len(rows),
                sweep_keys_per_condition,
                mean("all:calls") if metered else None,
                mean("all:prompt_tokens") if metered else None,
                mean("all:completion_tokens") if metered else None,
                mean("search:calls"),
                mean("visit:calls"),
            )
        )
    return by_condition


def _tool_rows(
    x: _Extrapolation,
    sweep: ResolvedExperiment,
    pilot: Sequence[Record],
    keyed: Mapping[_Key, Mapping[str, float]],
) -> list[ToolRow]:
    """Search and visit calls, the pilot's replayed ones, and their cost where priced."""
    search = sweep.experiment.search
    prices = {"search": search.price_per_call, "visit": search.price_per_visit}
    tools = []
    for tool, price in prices.items():
        calls = x.zero_or(f"{tool}:calls")
        tools.append(
            ToolRow(
                tool,
                calls,
                int(sum(keyed[r.key].get(f"{tool}:replayed", 0) for r in pilot)),
                price,
                calls.scaled(price) if price is not None else None,
            )
        )
    return tools


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
    experiment = sweep.experiment
    conditions = [str(c) for c in experiment.conditions]
    seeds = list(experiment.seeds)
    complete, incomplete = pilot_instances(records, conditions, seeds, source)
    pilot = [r for rs in complete.values() for r in rs]
    roles, metered = _pilot_roles(pilot, sweep)
    max_queries = experiment.search.max_queries
    pilot_keys = {r.key for r in pilot}
    counted = [r for r in replaced if r.key in pilot_keys]
    stopped = [r for r in unrecorded if r.key in pilot_keys]
    work = with_dialogues(pilot, [*counted, *stopped], dialogues or {}, conditions)
    keyed = _keyed_figures(work.records, traces, roles, max_queries, metered, work.added)
    keys_per_instance = len(conditions) * len(seeds)
    x = _extrapolate(complete, keyed, keys_per_instance, sweep_instances, resamples)
    model_rows = _model_rows(x, sweep, roles, target_hours, sweep_instances)
    tools = _tool_rows(x, sweep, pilot, keyed)
    known = [m.shards for m in model_rows if m.shards is not None]
    return Estimate(
        experiment=experiment.name,
        pilot_dir=source,
        pilot_instances=len(complete),
        pilot_keys=len(complete) * keys_per_instance,
        pilot_failed=sum(r.error is not None for r in pilot),
        sweep_instances=sweep_instances,
        conditions=conditions,
        seeds=seeds,
        sweep_keys=sweep_instances * keys_per_instance,
        roles=_role_rows(x, sweep, roles, pilot, keyed),
        models=model_rows,
        by_condition=_condition_rows(
            conditions, pilot, keyed, sweep_instances * len(seeds), metered
        ),
        tools=tools,
        calls=x.figure("all:calls") if metered else None,
        prompt_tokens=x.figure("all:prompt_tokens") if metered else None,
        completion_tokens=x.figure("all:completion_tokens") if metered else None,
        target_hours=target_hours,
        shards=max(known) if known else None,
        notes=_notes(sweep, pilot, keyed, incomplete, metered, model_rows, tools, len(complete))
        + _extra_note(_REPLACED, work.stripped(counted), roles, metered)
        + _extra_note(_UNRECORDED, work.stripped(stopped), roles, metered)
        + _auto_replicas_note(sweep, model_rows),
        pilot_replaced=len(counted),
        held=held_servers(model_rows, max(known), target_hours) if known else [],
        pilot_unrecorded=len(stopped),
    )


def _notes(
    sweep: ResolvedExperiment,
    pilot: list[Record],
    keyed: Mapping[tuple[str, str, int], Mapping[str, float]],
    incomplete: int,
    metered: bool,
    models: list[ModelRow],
    tools: list[ToolRow],
    instances: int,
) -> list[str]:
    """What a reader must know to trust the numbers as far as they go."""
    notes = []
    if instances < 2:
        notes.append("a pilot of 1 instance gives no interval: pilot more (--pilot N)")
    if incomplete:
        notes.append(f"{incomplete} instance(s) of the pilot miss some keys and were left out")
    if not metered:
        notes.append(
            "the pilot's records were made before each role's calls were recorded: only the "
            "searcher's are known (from the traces); run a new pilot for every role"
        )
    failed = sum(r.error is not None for r in pilot)
    if failed:
        notes.append(
            f"{failed} of the pilot's {len(pilot)} keys failed; their calls count, and a "
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
    drawn = read_draw(run_dir) or (
        f"the instances of {run_dir} as it ran them (not drawn by `cts estimate`: they may "
        "not represent the sweep's languages and constraint types)"
    )
    found = replace(found, pilot_drawn=drawn)
    extra = (
        model_changes(ran, sweep)
        if ran is not None
        else [f"{run.config} does not load ({unreadable}): its models are not compared"]
    )
    if unread:
        extra.append(f"{unread} trace(s) could not be read: their tool calls are not counted")
    found.notes.extend(extra)
    return found
