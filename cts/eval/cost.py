"""The arithmetic of `cts estimate`: a key's figures, their extrapolation to a sweep, and the
hours, GPUs and shards they come to.

A figure of the sweep is the pilot's mean per instance (its keys summed) times the sweep's
instances — the same as each condition's per-key mean times that condition's keys in the
sweep, since every pilot instance has every key. Summing per instance first keeps the keys of
one instance together: they share a dialogue and a query, so they are not independent draws.
The interval is a 95% percentile bootstrap over the pilot's instances: with five instances it
is rough, and it says only how much the pilot's instances differ.

Server-hours divide a model's generated tokens by its `throughput_tokens_per_s` (a figure
measured under a pipeline's load, prefill included); GPU-hours multiply by the GPUs one server
spans. A model served with `vllm.replicas: r` runs r servers in every shard: its shards are
those of r servers' throughput, and each shard holds r × its GPUs. Without a throughput the
hours are unknown, never guessed.

Apart from reading the pilot (cts/eval/pilot_records.py) and from the notes
(cts/eval/estimate_notes.py): these are functions over numbers and records already read,
which change when the way a cost is counted or extrapolated does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cts.eval.data.schema import Record
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.usage import RoleUsage, role_usage

#: Bootstrap resamples of the pilot's instances (a fixed seed: the same pilot, the same
#: interval).
RESAMPLES = 2000
BOOTSTRAP_SEED = 0

#: Per role, the figures a table shows.
ROLE_COLUMNS = ("calls", "cached_calls", "prompt_tokens", "completion_tokens")

#: A record's key: (instance id, condition, seed).
RecordKey = tuple[str, str, int]


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


@dataclass(frozen=True)
class Extrapolation:
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


def keyed_figures(
    pilot: Sequence[Record],
    traces: Mapping[str, Mapping[str, Any]],
    roles: Mapping[str, str],
    max_queries: int,
    metered: bool,
    counted: Sequence[Record],
) -> dict[RecordKey, dict[str, float]]:
    """Each pilot key's figures, with the model work of its replaced attempts (`counted`)."""
    keyed = {
        r.key: key_figures(r, traces.get(r.trace_id or ""), roles, max_queries, metered)
        for r in pilot
    }
    for r in counted:
        for name, value in key_figures(r, None, roles, max_queries, metered).items():
            keyed[r.key][name] = keyed[r.key].get(name, 0.0) + value
    return keyed


def extrapolate(
    complete: Mapping[str, list[Record]],
    keyed: Mapping[RecordKey, Mapping[str, float]],
    keys_per_instance: int,
    sweep_instances: int,
    resamples: int,
) -> Extrapolation:
    """Sum each instance's keys' figures and bootstrap the sweep's totals."""
    names = sorted({name for figures in keyed.values() for name in figures})
    column = {name: j for j, name in enumerate(names)}
    per_instance = np.zeros((len(complete), len(names)))
    for i, instance_id in enumerate(sorted(complete)):
        for r in complete[instance_id]:
            for name, value in keyed[r.key].items():
                per_instance[i, column[name]] += value
    low, high = _bootstrap(per_instance, sweep_instances, resamples)
    return Extrapolation(column, per_instance, low, high, keys_per_instance, sweep_instances)


# -- the tables' rows -------------------------------------------------------------------------


def role_rows(
    x: Extrapolation,
    sweep: ResolvedExperiment,
    roles: Mapping[str, str],
    pilot: Sequence[Record],
    keyed: Mapping[RecordKey, Mapping[str, float]],
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


def model_rows(
    x: Extrapolation,
    sweep: ResolvedExperiment,
    roles: Mapping[str, str],
    target_hours: float,
    sweep_instances: int,
) -> list[ModelRow]:
    """Per model: generated tokens, server and GPU hours (from its throughput) and shards.
    The lexical judge is no model: it has no row."""
    rows = []
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
        rows.append(
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
    return rows


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


def condition_rows(
    conditions: Sequence[str],
    pilot: Sequence[Record],
    keyed: Mapping[RecordKey, Mapping[str, float]],
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


def tool_rows(
    x: Extrapolation,
    sweep: ResolvedExperiment,
    pilot: Sequence[Record],
    keyed: Mapping[RecordKey, Mapping[str, float]],
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
