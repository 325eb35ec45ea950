"""`cts run --dry-run`: what a run would do — its keys to run and already done, where each
model runs, the search it uses, whether its run directory lets it resume — found without
building an engine, calling a model or writing a file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cts.eval.experiment import instances_for, require_roles, run_notes
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.fingerprint import fingerprint
from cts.eval.run.records import RecordStore
from cts.eval.run.run_dir import RunDir, Shard
from cts.eval.run.search_agent import corpus_digest
from cts.foundation.yaml_config import ConfigError
from cts.serving.server_group import ServeOptions, read_endpoints
from cts.serving.server_plan import served_models


@dataclass(frozen=True)
class ConditionPlan:
    condition: str
    #: The shard's instances × seeds.
    keys: int
    #: Recorded in any shard file that can hold the shard's keys (as `run_keys` counts them).
    done: int
    #: Of `done`, failures kept as done (without --retry-failed).
    failed: int

    @property
    def to_run(self) -> int:
        return self.keys - self.done


@dataclass(frozen=True)
class ModelPlan:
    #: The name roles use.
    ref: str
    #: The served name requests carry.
    name: str
    engine: str
    roles: list[str]
    #: The checkpoint (a path, hub id or `tiny:…`), as the config gives it.
    path: str
    #: The base URL an `openai` model is reached at, or its replicas' (None: none known before
    #: the run).
    endpoint: str | list[str] | None
    #: Engine `openai` with `vllm.serve`: `--serve` starts a vLLM server for it.
    servable: bool
    #: The run starts that server (`--serve` given).
    started: bool


@dataclass
class RunPlan:
    resolved: ResolvedExperiment
    run_dir: Path
    shard: Shard
    #: Instances in the dataset, in the run (after `limit`), in the shard.
    dataset_instances: int
    run_instances: int
    shard_instances: int
    conditions: list[ConditionPlan]
    models: list[ModelPlan]
    retry_failed: bool
    #: The run directory holds a config.yaml (the run resumes it).
    resumes: bool
    #: Why the run directory refuses this config (what changed), or None.
    refusal: str | None = None
    #: What the run would say before any model call (`cts.eval.experiment.run_notes`).
    notes: list[str] = field(default_factory=list)

    @property
    def keys(self) -> int:
        return sum(c.keys for c in self.conditions)

    @property
    def done(self) -> int:
        return sum(c.done for c in self.conditions)


def plan_run(
    resolved: ResolvedExperiment,
    run_dir: Path,
    shard: Shard,
    options: ServeOptions,
    retry_failed: bool = False,
) -> RunPlan:
    """What `cts run` with these options would do. The refusals that come before any model
    call (roles, dataset, golden seeds, an endpoints file) raise as they do for the run; the
    resume check, which the run makes when it writes config.yaml, is reported instead."""
    require_roles(resolved)
    urls = read_endpoints(options.endpoints) if options.endpoints is not None else {}
    ready = resolved.with_endpoints(urls)
    conditions = [str(c) for c in resolved.experiment.conditions]
    seeds = list(resolved.experiment.seeds)
    everything, instances = instances_for(resolved, conditions)
    mine = shard.select(instances)
    recorded = RecordStore(run_dir).completed_for(shard)
    per_condition = []
    for condition in conditions:
        keys = [(i.id, condition, s) for i in mine for s in seeds]
        found = [recorded[k] for k in keys if k in recorded]
        failed = sum(r.error is not None for r in found)
        done = len(found) - (failed if retry_failed else 0)
        per_condition.append(
            ConditionPlan(condition, len(keys), done, 0 if retry_failed else failed)
        )
    prints = fingerprint(everything, corpus_digest(resolved))  # a bad corpus raises
    run = RunDir(run_dir)
    refusal = None
    try:
        run.check_resume(resolved, prints)
    except ConfigError as e:
        refusal = str(e)
    return RunPlan(
        resolved=ready,
        run_dir=run_dir,
        shard=shard,
        dataset_instances=len(everything),
        run_instances=len(instances),
        shard_instances=len(mine),
        conditions=per_condition,
        models=_models(ready, options),
        retry_failed=retry_failed,
        resumes=run.config.is_file(),
        refusal=refusal,
        notes=run_notes(resolved, instances, conditions),
    )


def _models(resolved: ResolvedExperiment, options: ServeOptions) -> list[ModelPlan]:
    servable = served_models(resolved.model_configs)
    roles: dict[str, list[str]] = {}
    for role, config in resolved.experiment.roles.items():
        roles.setdefault(config.model, []).append(str(role))
    plans = []
    for ref, names in roles.items():
        model = resolved.model_configs[ref]
        plans.append(
            ModelPlan(
                ref=ref,
                name=model.name,
                engine=model.engine,
                roles=names,
                path=model.path,
                endpoint=model.endpoint if model.engine == "openai" else None,
                servable=ref in servable,
                started=options.serve and ref in servable,
            )
        )
    return plans
