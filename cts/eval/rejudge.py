"""`cts rejudge`: the stored final answers of a finished run scored again by another judge (or
the same judge with another prompt, sampling or `judge:` options), calling no other role.

What is kept and what is new. Every record of the source run is copied; only the judge stage
runs again, through `cts.eval.run.pipeline.judge_record`, the stage `cts run` judges with, so labels
become scores exactly as in a run. A record that failed before the judge (clarify, rewrite, search)
stays a failure, copied with its error and counted; one whose judge failed is judged again (its
answer was kept). A re-judged record's `seconds` is the new judge's time; the other fields
(questions, answers, rewrite, answer, usage) are the source's, and `trace_id` names a trace
under the source's traces/ (rejudge.json says where that is).

The configuration is the source's config.yaml (or `--config`) with the overrides. It must equal
the source's in everything but the judge — `roles.judge`, `judge:` and the model configs only
the judge uses — and the dataset must be the one the source ran on (its fingerprint): the
answers were made by the source's roles, and NEW/config.yaml describes them. The prompts may
differ (a new judge prompt is a reason to rejudge; no other role's prompt is sent). Conditions,
seeds and `dataset.limit` may select part of the source; every selected key must be recorded
in the source (an unfinished source is refused with what is missing). NEW/config.yaml's
fingerprint includes a digest of the source's config, so a resume with another judge is refused
as `cts run` refuses a changed config; a resume from another source run (whose config may be
the same) is refused by the source path NEW/rejudge.json names, and a NEW that holds a run but
no rejudge.json (an ordinary run) is never rejudged into.

The response cache — "without the response cache of the original run". A judge request is
cached under the request alone (engine, messages, sampling, output spec). A rejudge whose judge
sends the requests the source's judge sent (the same judge and options: a rerun-identity check;
or a change the requests do not show, such as another server for the same weights) would be
answered from the shared cache with the source's own labels, and agree with it by construction.
So a rejudge never reads the shared cache: its judge's answers are cached in NEW/cache/
responses.sqlite, a file no other run writes. Every label in NEW was given by the judge to this
rejudge; a resumed rejudge, and its other shards, replay only answers this rejudge was given.
`cache.enabled: false` turns even that off; `cache.path` cannot be set for a rejudge.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack, cast

import yaml

from cts.agents import judge
from cts.eval.audit.agreement import PairAgreement, compare
from cts.eval.audit.pairing import read_judgement
from cts.eval.data.dataset import load_instances
from cts.eval.data.schema import Instance, Record
from cts.eval.experiment import RunResult, require_judgeable, require_roles, until_signalled
from cts.eval.report.report import write_report
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.eval.run.dialogue import Clarification
from cts.eval.run.engines import open_engines
from cts.eval.run.fingerprint import changes, fingerprint, results_digest, results_view
from cts.eval.run.pipeline import PipelineContext, StageFailed, judge_record
from cts.eval.run.progress import key_progress
from cts.eval.run.records import Key, RecordStore
from cts.eval.run.run_dir import RunDir, RunDirError, Shard, frozen_experiment
from cts.eval.run.runner import RunControl, RunOutcome, already_done, run_keys
from cts.foundation.disk import write_whole
from cts.foundation.yaml_config import ConfigError, Override, parse_override, read_yaml
from cts.serving.engine import ChatModel, EngineStats
from cts.serving.model_config import check_api_keys, model_label
from cts.webdancer.agent import WebDancerAgent

#: Keys of a run's config (as `results_view` names them) a rejudge may change.
JUDGE_KEYS = ("roles.judge.", "judge.")


class SourceRunError(RunDirError):
    """A source run that cannot be re-judged as asked: the output directory is the source
    itself, or keys the rejudge covers are not recorded in the source."""


@dataclass(frozen=True)
class Source:
    """The run whose answers are judged again."""

    run: RunDir
    resolved: ResolvedExperiment
    #: Its config.yaml as written (the fingerprint included).
    document: dict[str, Any]

    @property
    def digest(self) -> str:
        """What the source's records depend on (cts/eval/run/fingerprint.py), hashed."""
        return results_digest(self.document)


def load_source(path: Path) -> Source:
    run = RunDir(path)
    resolved = run.read_config()  # RunDirError without config.yaml
    document, _ = read_yaml(run.config)
    return Source(run, resolved, document)


def rejudge_experiment(
    source_dir: Path,
    output_dir: Path,
    config: str | Path | None = None,
    overrides: Sequence[str | Override] = (),
) -> ResolvedExperiment:
    """The rejudge's experiment: `config` (default: the source's config.yaml) with `overrides`,
    caching in NEW/cache/ (see the module's docstring). ConfigError when it changes anything
    but the judge, or sets cache.path; SourceRunError when NEW is the source."""
    source = load_source(source_dir)
    if output_dir.resolve() == source_dir.resolve():
        raise SourceRunError(
            f"--output-dir {output_dir}: is the source run itself; rejudge into a new directory"
        )
    require_rejudge_of(source, RunDir(output_dir))
    for item in overrides:
        parsed = parse_override(item) if isinstance(item, str) else item
        if parsed.keys[:2] == ("cache", "path") or parsed.keys == ("cache",):
            raise ConfigError(
                f"--set {item if isinstance(item, str) else parsed.label}: a rejudge caches its "
                f"judge's answers in {RunDir(output_dir).own_cache}, never in a shared cache "
                "(that would replay the source run's judge); cache.enabled=false turns it off"
            )
    if config is not None:
        resolved = load_experiment(config, overrides)
    else:
        resolved = _source_with(source, output_dir, overrides)
    cache = resolved.experiment.cache.model_copy(
        update={"path": str(RunDir(output_dir).own_cache.resolve())}
    )
    experiment = resolved.experiment.model_copy(
        update={"cache": cache, "output_dir": str(output_dir)}
    )
    resolved = resolved.model_copy(update={"experiment": experiment})
    require_roles(resolved, ["judge"])
    _refuse_other_than_judge(source, resolved)
    return resolved


def _source_with(
    source: Source, output_dir: Path, overrides: Sequence[str | Override]
) -> ResolvedExperiment:
    """The source's experiment (models inlined, as a Slurm task's frozen config) loaded again
    with the overrides: a new judge model is looked up as a name or path is in any config."""
    with tempfile.TemporaryDirectory(prefix="cts-rejudge-") as scratch:
        # experiments/ below the scratch folder: names are looked up in the shipped
        # cts/configs/models, never in a stray models/ folder beside the temporary file.
        path = Path(scratch) / "experiments" / "source.yaml"
        path.parent.mkdir()
        document = frozen_experiment(source.resolved, output_dir)
        path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
        try:
            resolved = load_experiment(path, overrides)
        except ConfigError as e:
            raise ConfigError(
                str(e).replace(str(path), f"{source.run.config} (experiment)")
            ) from None
    return resolved.model_copy(update={"path": source.run.config})


def _judge_refs(document: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The model refs the judge uses, and those any other role uses."""
    roles = (document.get("experiment") or {}).get("roles") or {}
    judges = {str(r["model"]) for role, r in roles.items() if role == "judge"}
    others = {str(r["model"]) for role, r in roles.items() if role != "judge"}
    return judges, others


def _refuse_other_than_judge(source: Source, resolved: ResolvedExperiment) -> None:
    new = yaml.safe_load(resolved.to_yaml())
    judge_new, others_new = _judge_refs(new)
    judge_old, others_old = _judge_refs(source.document)
    # Longest first: a ref may contain dots (qwen2.5-7b), or be a prefix of another.
    judge_only = sorted((judge_new | judge_old) - others_new - others_old, key=len, reverse=True)

    def may_change(key: str) -> bool:
        return key.startswith(JUDGE_KEYS) or any(key.startswith(f"models.{r}.") for r in judge_only)

    def bound(view: dict[str, Any]) -> dict[str, Any]:
        # The fingerprint is checked apart: the dataset must match, the prompts may not.
        return {
            k: v for k, v in view.items() if not may_change(k) and not k.startswith("fingerprint.")
        }

    changed = changes(bound(results_view(source.document)), bound(results_view(new)))
    if changed:
        raise ConfigError(
            f"a rejudge changes the judge only (roles.judge, judge:, and the models only the "
            f"judge uses); this config also changes what {source.run.root}'s answers were made "
            "with:\n  " + "\n  ".join(changed)
        )


def judge_served(resolved: ResolvedExperiment) -> ResolvedExperiment:
    """The experiment as `--serve` sees it: only the judge's model is served (no other role
    is called)."""
    judge_ref = resolved.experiment.roles["judge"].model
    configs = {
        ref: m
        if ref == judge_ref
        else m.model_copy(update={"vllm": m.vllm.model_copy(update={"serve": False})})
        for ref, m in resolved.model_configs.items()
    }
    return resolved.model_copy(update={"model_configs": configs})


def with_judge_from(resolved: ResolvedExperiment, ready: ResolvedExperiment) -> ResolvedExperiment:
    """`resolved` with the judge's model config of `ready` (its endpoint, once served)."""
    ref = resolved.experiment.roles["judge"].model
    configs = {**resolved.model_configs, ref: ready.model_configs[ref]}
    return resolved.model_copy(update={"model_configs": configs})


def describe_judge(resolved: ResolvedExperiment) -> dict[str, Any]:
    """The judge a run's labels come from: model, served name, sampling and `judge:` options."""
    ref = resolved.experiment.roles["judge"].model
    return {
        "model": ref,
        "label": model_label(ref, resolved.model_for("judge").name),
        "sampling": resolved.sampling_for("judge").model_dump(mode="json"),
        "options": resolved.experiment.judge.model_dump(mode="json"),
    }


def judge_context(
    engine: ChatModel, resolved: ResolvedExperiment, instances: Sequence[Instance] = ()
) -> PipelineContext:
    """A pipeline context in which only the judge stage runs: `judge_record` reads the judge's
    engine and sampling and the `judge:` options (its canary's `other` answers from
    `instances`). There is no search agent (a rejudge never searches) and the clarification
    has no roles (it never asks)."""
    return PipelineContext(
        roles={"judge": engine},
        agent=cast(WebDancerAgent, None),
        sampling={"judge": resolved.sampling_for("judge")},
        clarification=Clarification({}, {}, k_max=0),
        judge=resolved.experiment.judge,
        canary_others=judge.other_answers(instances),
    )


def judged_again(record: Record, instance: Instance) -> bool:
    """Whether a source record is judged again: it reached the judge (no error, or its judge
    failed) and the instance has golden nuggets. The rest is copied as it is."""
    reached = record.error is None or record.error.get("stage") == "judge"
    return reached and instance.golden is not None


async def rejudge_record(source: Record, instance: Instance, ctx: PipelineContext) -> Record:
    """The source's record with the new judge's labels and scores (or its judge failure)."""
    record = source.model_copy(deep=True)
    if not judged_again(source, instance):
        return record
    # The source judge's canary too: the new judge draws the same records and runs its own.
    record.labels, record.scores, record.error, record.canary = {}, {}, None, None
    started = time.perf_counter()
    try:
        await judge_record(instance, record, ctx)
    except StageFailed as e:
        record.error = e.error
    finally:
        record.seconds = round(time.perf_counter() - started, 3)
    return record


@dataclass
class RejudgeResult(RunResult):
    #: Records written this time that failed before judging in the source (copied as they are).
    copied_failures: int = 0
    #: The whole rejudge against its source (`cts judge agreement SOURCE NEW`): with the same
    #: judge, its movement is the judge's noise floor. None for a shard or a stopped rejudge.
    against_source: PairAgreement | None = None


def _require_own_cache(resolved: ResolvedExperiment, output_dir: Path) -> None:
    """A rejudge caches its judge's answers in its own run directory only (ConfigError)."""
    caching = resolved.experiment.cache
    own = RunDir(output_dir).own_cache.resolve()
    if caching.enabled and caching.resolved_path().resolve() != own:
        raise ConfigError(
            f"cache.path {caching.path}: a rejudge caches its judge's answers in {own} only "
            "(build its experiment with rejudge_experiment)"
        )


def _source_instances(
    resolved: ResolvedExperiment, source: Source
) -> tuple[list[Instance], dict[str, str]]:
    """The instances to rejudge (the dataset, with its `limit`) and the rejudge's fingerprint,
    which carries the source's corpus digest. ConfigError when the dataset is not the one the
    source ran on."""
    dataset = resolved.experiment.dataset
    everything = load_instances(dataset.model_copy(update={"limit": None}))
    source_prints = source.document.get("fingerprint") or {}
    # The answers are the source's: so is the corpus they were searched in.
    prints = fingerprint(everything, source_prints.get("corpus"))
    ran_on = source_prints.get("dataset")
    if ran_on is not None and ran_on != prints["dataset"]:
        raise ConfigError(
            f"{dataset.path}: the dataset is not the one {source.run.root} ran on (its "
            "fingerprint.dataset differs): its nuggets or queries changed since, and the "
            "answers would be judged against other nuggets"
        )
    instances = everything[: dataset.limit] if dataset.limit else everything
    return instances, prints


def _require_recorded(
    source: Source,
    recorded: dict[Key, Record],
    instances: list[Instance],
    conditions: list[str],
    seeds: list[int],
    shard: Shard,
) -> None:
    """SourceRunError when a key of this shard has no record in the source run."""
    mine = [(i.id, c, s) for i in shard.select(instances) for c in conditions for s in seeds]
    missing = [k for k in mine if k not in recorded]
    if missing:
        raise SourceRunError(
            f"{source.run.root}: {len(missing)} of the {len(mine)} keys to rejudge "
            f"{'in shard ' + shard.name + ' ' if shard.count > 1 else ''}have no record in the "
            f"source run (e.g. {', '.join(map(str, missing[:3]))}); finish it first (`cts run`, "
            "or `cts merge` to list what is missing), or select its conditions and seeds with "
            "--set"
        )


def require_rejudge_of(source: Source, run: RunDir) -> None:
    """SourceRunError unless `run` is new or a rejudge of `source` (its rejudge.json names the
    same run directory). The config digest alone cannot tell: another run of the same config
    (other answers, from a sampled model) has the same one, and an ordinary run has none."""
    if not run.config.is_file():
        return
    if not run.provenance.is_file():
        raise SourceRunError(
            f"--output-dir {run.root}: holds a run that is not a rejudge (no "
            f"{run.provenance.name}); rejudging {source.run.root} into it would mix its records "
            "with the rejudge's: rejudge into a new directory"
        )
    try:
        named = json.loads(run.provenance.read_text())["source"]["path"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SourceRunError(f"{run.provenance}: unreadable ({e}); cannot tell its source") from e
    if Path(named).resolve() != source.run.root.resolve():
        raise SourceRunError(
            f"--output-dir {run.root}: is a rejudge of {named}, not of "
            f"{source.run.root.resolve()}; resuming it from another source run would mix their "
            "answers: rejudge into a new directory"
        )


def _write_provenance(run: RunDir, source: Source, resolved: ResolvedExperiment) -> None:
    """provenance.json: the source run (path, config digest, fingerprint, system, judge), the
    new judge and its cache."""
    provenance = {
        "source": {
            "path": str(source.run.root.resolve()),
            "config_digest": source.digest,
            "fingerprint": source.document.get("fingerprint") or {},
            "system": source.resolved.system_name(),
            "judge": describe_judge(source.resolved),
        },
        "judge": describe_judge(resolved),
        "cache": (
            resolved.experiment.cache.path if resolved.experiment.cache.enabled else "disabled"
        ),
    }
    write_whole(run.provenance, json.dumps(provenance, indent=1, ensure_ascii=False))


def rejudge_run(
    resolved: ResolvedExperiment,
    source_dir: Path,
    output_dir: Path,
    **control: Unpack[RunControl],
) -> RejudgeResult:
    """Judge (a shard of) the source run's answers again into `output_dir` with `resolved`
    (from `rejudge_experiment`); resumes, shards, stops and reports like `run_experiment`."""
    shard = control.get("shard") or Shard()
    require_roles(resolved, ["judge"])
    source = load_source(source_dir)
    run = RunDir(output_dir)
    # Also here, not only in rejudge_experiment: whoever built `resolved`, the records of NEW
    # never describe other answers, nor hold a label replayed from a shared cache.
    require_rejudge_of(source, run)
    _refuse_other_than_judge(source, resolved)
    _require_own_cache(resolved, output_dir)
    instances, prints = _source_instances(resolved, source)
    require_judgeable(resolved, instances)
    conditions = [str(c) for c in resolved.experiment.conditions]
    seeds = list(resolved.experiment.seeds)
    recorded = RecordStore(source.run.root).completed()
    _require_recorded(source, recorded, instances, conditions, seeds, shard)
    prints = {**prints, "source": source.digest}
    # Everything checked before anything is written; then rejudge.json before config.yaml, so
    # that a shard starting beside this one never finds a config.yaml without it.
    run.check_resume(resolved, prints)
    model = resolved.experiment.roles["judge"].model
    check_api_keys({model: resolved.model_configs[model]})  # the one model a rejudge opens
    _write_provenance(run, source, resolved)
    run.write_config(resolved, prints)
    started = time.perf_counter()
    outcome, stats, cache, copied = asyncio.run(
        _rejudge(resolved, run, recorded, instances, (conditions, seeds), control)
    )
    written = against = None
    if shard.count == 1 and not outcome.interrupted:
        written = write_report([output_dir], output_dir)
        against = compare(read_judgement(source_dir), read_judgement(output_dir))
    seconds = time.perf_counter() - started
    return RejudgeResult(
        output_dir,
        outcome,
        seconds,
        cache,
        stats,
        written,
        copied_failures=copied,
        against_source=against,
    )


async def _rejudge(
    resolved: ResolvedExperiment,
    run: RunDir,
    recorded: dict[Key, Record],
    instances: list[Instance],
    keys: tuple[list[str], list[int]],
    control: RunControl,
) -> tuple[RunOutcome, dict[str, EngineStats], dict[str, int] | None, int]:
    conditions, seeds = keys
    shard, retry_failed = control.get("shard") or Shard(), control.get("retry_failed", False)
    store = RecordStore(run.root)
    by_id = {i.id: i for i in instances}
    # The judge alone: no other role's engine is even built.
    async with open_engines(resolved, ["judge"]) as engines:
        ctx = judge_context(engines.roles["judge"], resolved, instances)
        mine = {i.id for i in shard.select(instances)}
        total = len(mine) * len(conditions) * len(seeds)
        already = already_done(store, shard, (mine, conditions, seeds), retry_failed)
        title = f"rejudge {resolved.experiment.name}"
        show = control.get("show_progress", True)
        async with key_progress(title, total, already, show) as advance:
            copied = 0

            def done(record: Record) -> None:
                nonlocal copied
                source = recorded[record.key]
                copied += record.error is not None and not judged_again(
                    source, by_id[record.instance_id]
                )
                advance(record)

            outcome = RunOutcome()
            await until_signalled(
                run_keys(
                    instances,
                    conditions,
                    seeds,
                    lambda i, c, s: rejudge_record(recorded[(i.id, c, s)], i, ctx),
                    store,
                    shard,
                    concurrency=resolved.experiment.concurrency,
                    on_done=done,
                    retry_failed=retry_failed,
                    outcome=outcome,
                ),
                control.get("watch"),
                outcome=outcome,
            )
        stats = {name: e.stats for name, e in engines.by_model.items()}
        # `is not None`: an empty cache is falsy (it has a length).
        cache = engines.cache.stats() if engines.cache is not None else None
        return outcome, stats, cache, copied
