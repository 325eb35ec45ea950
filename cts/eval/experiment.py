"""`cts run`: an experiment into its run directory — config, records, traces, summary, report.

Resume is the default (keys already recorded are skipped). Ctrl-C or SIGTERM (a preempted Slurm
job) cancels what is in flight; every finished record is already on disk, so the next start
resumes. A sharded run writes its shard's records; `cts merge` then checks completeness and
writes the summary and report.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Unpack

from cts.agents import judge, lexical_judge
from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.golden import GOLDEN, GoldenReport, golden_dataset
from cts.eval.data.readers import DatasetError
from cts.eval.data.schema import Instance
from cts.eval.report.report import Report, write_report
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import Role
from cts.eval.run.dialogue import Clarification, DialogueStore
from cts.eval.run.engines import open_engines
from cts.eval.run.fingerprint import dataset_digest, fingerprint
from cts.eval.run.oracle import golden_searcher
from cts.eval.run.pipeline import PipelineContext, clarify_turns, run_instance
from cts.eval.run.progress import key_progress
from cts.eval.run.records import MergeReport, RecordStore, UnrecordedStore, merge, write_jsonl
from cts.eval.run.run_dir import RunDir, Shard
from cts.eval.run.runner import RunControl, RunOutcome, already_done, run_keys
from cts.eval.run.search_agent import corpus_digest, open_agent
from cts.foundation.yaml_config import ConfigError
from cts.serving.cache import EVALUATION, GOLDEN_CONSTRUCTION
from cts.serving.engine import EngineStats
from cts.serving.model_config import check_api_keys
from cts.serving.server_group import ServeOptions, served
from cts.serving.types import Sampling
from cts.webdancer.corpus import Problem

#: A cache's hits, misses and invalid rows.
Counts = dict[str, int]


@dataclass
class RunResult:
    run_dir: Path
    outcome: RunOutcome
    seconds: float
    cache: dict[str, int] | None
    #: Model name → calls, constrained calls, tokens and errors by kind.
    engine_stats: dict[str, EngineStats]
    #: What the report wrote (None: a shard or a stopped run, whose report `cts merge` writes).
    report: Report | None
    #: The tool cache's hits, misses and invalid rows (None: no tool cache).
    tool_cache: dict[str, int] | None = None

    @property
    def model_calls(self) -> int:
        return sum(s.calls for s in self.engine_stats.values())


async def until_signalled(
    work: Awaitable[RunOutcome],
    watch: Callable[[], None] | None = None,
    poll_s: float = 2.0,
    outcome: RunOutcome | None = None,
) -> RunOutcome:
    """Run `work`; SIGINT or SIGTERM cancels it and gives an interrupted outcome. Finished
    records are already on disk (each is appended and fsync'd as it completes), so the run
    resumes where it stopped. `outcome` is the one `work` fills as it goes (run_keys's): a
    second signal cancels the work before it can return it, and this returns it instead, its
    counts kept. `watch` is called every `poll_s` seconds (e.g. checking that the model
    servers live); what it raises cancels the work and is raised here, whatever the work
    returned (run_keys answers a cancellation with an interrupted outcome)."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    failure: list[BaseException] = []

    async def watcher(check: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(poll_s)
            try:
                check()
            except Exception as e:
                failure.append(e)
                task.cancel()
                return

    watching = asyncio.create_task(watcher(watch)) if watch else None
    try:
        result = await task
    except asyncio.CancelledError:
        result = outcome if outcome is not None else RunOutcome()
        result.interrupted = True
    finally:
        if watching:
            watching.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    if failure:
        raise failure[0] from None
    return result


async def _run(
    resolved: ResolvedExperiment,
    run: RunDir,
    instances: list[Instance],
    keys: tuple[list[str], list[int]],
    control: RunControl,
) -> tuple[RunOutcome, dict[str, EngineStats], tuple[Counts | None, Counts | None]]:
    """The outcome, each model's engine stats, and the response and tool caches' counts."""
    experiment = resolved.experiment
    conditions, seeds = keys
    shard, retry_failed = control.get("shard") or Shard(), control.get("retry_failed", False)
    store = RecordStore(run.root)
    # Golden construction's answers are cached apart from every evaluation's (cts/serving/cache.py).
    purpose = GOLDEN_CONSTRUCTION if GOLDEN in conditions else EVALUATION
    async with (
        open_engines(resolved) as engines,
        open_agent(resolved, engines.for_purpose(purpose)) as agent,
    ):
        sampling: dict[str, Sampling] = {
            role: resolved.sampling_for(role) for role in experiment.roles
        }
        roles = {str(role): engine for role, engine in engines.roles.items()}
        unrecorded = UnrecordedStore(run.root)
        ctx = PipelineContext(
            roles=roles,
            agent=agent,
            sampling=sampling,
            clarification=Clarification(
                roles,
                sampling,
                experiment.clarification,
                k_max=max((clarify_turns(c) or 0 for c in conditions), default=0),
                store=DialogueStore(run.dialogues, shard.name),
            ),
            golden=experiment.golden,
            judge=experiment.judge,
            trace_dir=run.traces,
            unrecorded=lambda record: unrecorded.append(record, shard),
            canary_others=judge.other_answers(instances),
        )
        mine = {i.id for i in shard.select(instances)}
        total = len(mine) * len(conditions) * len(seeds)
        already = already_done(store, shard, (mine, conditions, seeds), retry_failed)
        show = control.get("show_progress", True)
        async with key_progress(experiment.name, total, already, show) as done:
            outcome = RunOutcome()
            try:
                await until_signalled(
                    run_keys(
                        instances,
                        conditions,
                        seeds,
                        lambda i, c, s: run_instance(i, c, s, ctx),
                        store,
                        shard,
                        concurrency=experiment.concurrency,
                        on_done=done,
                        retry_failed=retry_failed,
                        key_order=experiment.key_order,
                        outcome=outcome,
                    ),
                    control.get("watch"),
                    outcome=outcome,
                )
            finally:
                await ctx.clarification.aclose()
        stats = {name: e.stats for name, e in engines.by_model.items()}
        caches = (
            engines.cache.stats() if engines.cache is not None else None,
            agent.tools.cache.stats() if agent.tools.cache is not None else None,
        )
        return outcome, stats, caches


def instances_for(
    resolved: ResolvedExperiment, conditions: Sequence[str]
) -> tuple[list[Instance], list[Instance]]:
    """The whole dataset (it is fingerprinted, so that a resume may raise or lower the limit)
    and the instances the run covers, once the checks that refuse a run before any model is
    called have passed (DatasetError, ConfigError)."""
    dataset = resolved.experiment.dataset
    everything = load_instances(dataset.model_copy(update={"limit": None}))
    instances = everything[: dataset.limit] if dataset.limit else everything
    if "oracle" in conditions:
        _check_golden_seeds(resolved, instances)
    if GOLDEN not in conditions:
        unscorable = no_nuggets(dataset, instances)
        if unscorable is not None:
            raise DatasetError([unscorable])
        require_judgeable(resolved, instances)
    return everything, instances


def require_judgeable(resolved: ResolvedExperiment, instances: list[Instance]) -> None:
    """With the lexical judge, DatasetError naming every nugget it cannot judge (no word or
    number beyond its instance's fused query: cts.agents.lexical_judge.check_nugget), before any
    model is called: every record of the instance would otherwise fail at its judge."""
    roles = resolved.experiment.roles
    if "judge" not in roles or resolved.model_for("judge").engine != "lexical":
        return
    problems = []
    for instance in instances:
        for nugget in instance.golden.nuggets if instance.golden else ():
            try:
                lexical_judge.check_nugget(nugget.text, instance.fused_query)
            except lexical_judge.UnjudgeableNugget as e:
                where = f"golden.nuggets (instance {instance.id}, nugget {nugget.id})"
                problems.append(Problem(resolved.experiment.dataset.path, None, where, str(e)))
    if problems:
        raise DatasetError(problems)


def no_nuggets(dataset: DatasetSource, instances: list[Instance]) -> Problem | None:
    """Evaluation scores against golden nuggets: without any, every model call is wasted."""
    if any(i.golden and i.golden.nuggets for i in instances):
        return None
    return Problem(
        dataset.path,
        None,
        "golden",
        f"none of the {len(instances)} instance(s) has golden nuggets, so nothing could be "
        "scored; give a dataset with golden nuggets (or dataset.gold, a gold table joined by "
        "id), or build them with `cts golden build`",
    )


#: How many ids of the instances without golden nuggets the run's note names.
UNSCORED_SHOWN = 3


def unscored_note(instances: list[Instance]) -> str | None:
    """A line saying which of `instances` have no golden nuggets (they run, costing every
    model call, but are never scored), or None when all have them or none does (that run is
    refused: `no_nuggets`)."""
    lacking = [i.id for i in instances if not (i.golden and i.golden.nuggets)]
    if not lacking or len(lacking) == len(instances):
        return None
    shown = ", ".join(lacking[:UNSCORED_SHOWN])
    more = len(lacking) - UNSCORED_SHOWN
    if more > 0:
        shown += f" and {more} more"
    return (
        f"note: {len(lacking)} of {len(instances)} instance(s) have no golden nuggets "
        f"({shown}): they run but are not scored"
    )


def run_notes(
    resolved: ResolvedExperiment, instances: list[Instance], conditions: Sequence[str]
) -> list[str]:
    """What the user should know before any model is called: sampling overrides a role
    replaces, and instances that will run unscored."""
    notes = [f"note: {unused}" for unused in resolved.unused_sampling()]
    # Golden construction runs instances without nuggets by design: nothing to say there.
    unscored = unscored_note(instances) if GOLDEN not in conditions else None
    return notes + ([unscored] if unscored is not None else [])


def _run_into(
    resolved: ResolvedExperiment,
    run_dir: Path,
    keys: tuple[list[str], list[int]],
    report: bool,
    control: RunControl,
    notify: Callable[[str], None] = lambda line: None,
) -> RunResult:
    """Record `keys` (conditions, seeds) for the shard's instances into `run_dir`; with
    `report`, a whole finished run also gets its summary and report. `notify` is told what
    the user should know before any model is called."""
    everything, instances = instances_for(resolved, keys[0])
    for note in run_notes(resolved, instances, keys[0]):
        notify(note)
    run = RunDir(run_dir)
    check_api_keys(resolved.model_configs)  # what opening the engines would refuse, unwritten
    run.write_config(resolved, fingerprint(everything, corpus_digest(resolved)))
    started = time.perf_counter()
    outcome, stats, (cache, tool_cache) = asyncio.run(_run(resolved, run, instances, keys, control))
    written = None
    whole = (control.get("shard") or Shard()).count == 1
    if report and whole and not outcome.interrupted:
        written = write_report([run_dir], run_dir)
    seconds = time.perf_counter() - started
    return RunResult(run_dir, outcome, seconds, cache, stats, written, tool_cache)


#: The roles every evaluated condition uses (search, the visit summary, the judge), and those
#: clarify@k adds.
SEARCH_ROLES: tuple[Role, ...] = ("searcher", "summarizer", "judge")
CLARIFY_ROLES: tuple[Role, ...] = ("clarifier", "user_answerer", "rewriter")
GOLDEN_ROLES: tuple[Role, ...] = ("searcher", "summarizer", "nugget_builder")


def missing_roles(resolved: ResolvedExperiment, needed: Sequence[Role] = ()) -> list[Role]:
    """Of `needed` (default: what the experiment's conditions use), the roles not set."""
    if not needed:
        clarify = any(c.startswith("clarify@") for c in resolved.experiment.conditions)
        needed = [*SEARCH_ROLES, *(CLARIFY_ROLES if clarify else ())]
    return [role for role in needed if role not in resolved.experiment.roles]


def require_roles(resolved: ResolvedExperiment, needed: Sequence[Role] = ()) -> None:
    """Before anything is written or loaded: a ConfigError naming `roles` (file:line) and what
    is missing."""
    missing = missing_roles(resolved, needed)
    if missing:
        raise ConfigError(
            f"{resolved.origins.where('roles')}: missing {', '.join(missing)}, which "
            f"{resolved.experiment.name}'s work needs (conditions: "
            f"{', '.join(resolved.experiment.conditions)})"
        )


def run_experiment(
    resolved: ResolvedExperiment,
    run_dir: Path,
    *,
    notify: Callable[[str], None] = lambda line: None,
    **control: Unpack[RunControl],
) -> RunResult:
    """Run (a shard of) an experiment into `run_dir`, resuming what is recorded there;
    `control` (cts/eval/run/runner.py RunControl): `shard`, `show_progress`, `watch` (what it
    raises stops the run, keeping every finished record), `retry_failed`. `notify` gets a
    line, before any model call, for each role override the role replaces
    (`ResolvedExperiment.unused_sampling`) and when some instances have no golden nuggets. A
    whole run that finishes gets its report."""
    require_roles(resolved)
    keys = ([str(c) for c in resolved.experiment.conditions], list(resolved.experiment.seeds))
    return _run_into(resolved, run_dir, keys, True, control, notify)


@dataclass(frozen=True)
class Served:
    """An experiment pointed at its models for a block (see `serving_for`)."""

    #: The experiment with every served model's endpoint filled in.
    resolved: ResolvedExperiment
    #: Raises ServerError when a server started for the block has died (None: none started).
    watch: Callable[[], None] | None


@contextmanager
def serving_for(
    resolved: ResolvedExperiment,
    options: ServeOptions,
    log_dir: Path,
    on_start: Callable[[int], None] = lambda n: None,
) -> Iterator[Served]:
    """For the block, the experiment at its models: at an endpoints file's URLs
    (`options.endpoints`), or at vLLM servers started for the block (`options.serve`: each
    model with `vllm.serve`, planned on the GPUs, logs under `log_dir`) and stopped after,
    whatever ends the block. `on_start(n)` is told before n servers start. What `cts run
    --serve` does around `run_experiment`:

        with serving_for(resolved, ServeOptions(serve=True), run_dir / "logs") as ready:
            run_experiment(ready.resolved, run_dir, watch=ready.watch)
    """
    with served(resolved.model_configs, options, log_dir, on_start) as (urls, watch):
        yield Served(resolved.with_endpoints(urls), watch)


def serve_and_run(
    resolved: ResolvedExperiment,
    run_dir: str | Path,
    *,
    serve: ServeOptions | None = None,
    starting: Callable[[int], None] = lambda n: None,
    notify: Callable[[str], None] = lambda line: None,
    **control: Unpack[RunControl],
) -> RunResult:
    """Serve, then run: the experiment's models reached as `serve` says (default: in-process
    or at their endpoints; `ServeOptions(serve=True)` starts a vLLM server per model, its logs
    in the run directory, each stopped after; `ServeOptions(endpoints=F)` a running `cts
    serve`'s), then `run_experiment` into `run_dir` with `control` (a dead server stops it,
    finished records kept). The one place `cts run`, the training loop and the Slurm tasks
    run an experiment; `cts.run` in Python."""
    run_dir = Path(run_dir)
    control["shard"] = shard = control.get("shard") or Shard()
    logs = RunDir(run_dir).serve_logs(shard)
    with serving_for(resolved, serve or ServeOptions(), logs, starting) as ready:
        control["watch"] = ready.watch
        return run_experiment(ready.resolved, run_dir, notify=notify, **control)


def _check_golden_seeds(resolved: ResolvedExperiment, instances: list[Instance]) -> None:
    """Refuse to evaluate with a seed the dataset's golden runs used: the oracle condition
    would replay the very search its nuggets were extracted from."""
    seeds = set(resolved.experiment.seeds)
    clashes = [
        (i.id, i.golden.seed) for i in instances if i.golden is not None and i.golden.seed in seeds
    ]
    if clashes:
        instance, seed = clashes[0]
        raise ConfigError(
            f"{resolved.origins.where('seeds')}: {seed} is the seed of the golden run of "
            f"{len(clashes)} instance(s) (e.g. {instance}) in {resolved.experiment.dataset.path}: "
            "the oracle condition would replay the run its nuggets came from; evaluate with other "
            "seeds"
        )


def build_golden(
    resolved: ResolvedExperiment, run_dir: Path, **control: Unpack[RunControl]
) -> RunResult:
    """Golden construction for (a shard of) the experiment's dataset into `run_dir`: one
    `golden` record per instance (search on the fused query with `golden.seed`, disjoint from
    the evaluation seeds, nuggets from its trace). Resumes and stops like `run_experiment`;
    `finish_golden` writes the dataset."""
    require_roles(resolved, GOLDEN_ROLES)
    seed = resolved.experiment.golden.seed
    _refuse_other_golden_seeds(RecordStore(run_dir), seed)
    return _run_into(resolved, run_dir, ([GOLDEN], [seed]), False, control)


def _refuse_other_golden_seeds(store: RecordStore, seed: int) -> None:
    """Golden records of another seed (before `golden.seed` existed the first evaluation seed
    was used) would be silently ignored and every instance searched again."""
    other = sorted({r.seed for r in store.completed().values() if r.condition == GOLDEN} - {seed})
    if other:
        raise ConfigError(
            f"{store.root}: golden records built with seed(s) {other}, but golden.seed is {seed}; "
            "build into a new directory (a seed that is also an evaluation seed would make the "
            "oracle condition replay the golden run)"
        )


def fingerprinted_instances(run: RunDir, resolved: ResolvedExperiment) -> list[Instance]:
    """The instances of the run's dataset (first `limit`), refused (the ConfigError a resume
    gives) when the dataset changed since the run fingerprinted it: merged records, or golden
    nuggets, would be written under queries they were not made for."""
    dataset = resolved.experiment.dataset
    # Digested whole, as `instances_for` does when the run writes the fingerprint.
    everything = load_instances(dataset.model_copy(update={"limit": None}))
    run.check_resume(resolved, {**run.read_fingerprint(), "dataset": dataset_digest(everything)})
    return everything[: dataset.limit] if dataset.limit else everything


def finish_golden(run_dir: Path) -> tuple[MergeReport, GoldenReport | None]:
    """Check every instance has exactly one golden record across shards; when so, write
    RUN_DIR/dataset.jsonl (instances with golden nuggets; failed ones are listed, not written)
    and RUN_DIR/golden_summary.json. ConfigError, writing nothing, when the dataset is not the
    one the build fingerprinted."""
    run = RunDir(run_dir)
    resolved = run.read_config()
    experiment = resolved.experiment
    instances = fingerprinted_instances(run, resolved)
    store = RecordStore(run_dir)
    _refuse_other_golden_seeds(store, experiment.golden.seed)
    merged = merge(store, instances, [GOLDEN], [experiment.golden.seed])
    if not merged.ok:
        return merged, None
    searcher = golden_searcher(resolved)
    report = golden_dataset(
        instances, {key[0]: r for key, r in merged.records.items()}, run.golden_dataset, searcher
    )
    summary = {
        "dataset": str(report.dataset),
        # Provenance: the golden search runs' seed, disjoint from the evaluation seeds, and
        # the searcher (a greedy evaluation searcher on it makes the oracle repeat this run).
        "seed": experiment.golden.seed,
        "searcher": searcher.model_dump(),
        "instances": len(instances),
        "built": report.built,
        "nuggets": report.nuggets,
        "nuggets_per_instance": round(report.nuggets / report.built, 2) if report.built else 0,
        "weights": {str(w): n for w, n in sorted(report.weights.items())},
        "failed": report.failed,
    }
    run.golden_summary.write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    return merged, report


def merge_run(run_dir: Path) -> MergeReport:
    """Check that every key of the run's config is recorded exactly once across shards; when
    it is, write the merged records/<condition>/merged.jsonl, summary and report. ConfigError,
    writing nothing, when the dataset is not the one the run fingerprinted."""
    run = RunDir(run_dir)
    resolved = run.read_config()
    experiment = resolved.experiment
    instances = fingerprinted_instances(run, resolved)
    store = RecordStore(run_dir)
    report = merge(store, instances, experiment.conditions, experiment.seeds)
    if report.ok:
        for condition in experiment.conditions:
            # Dataset order, then seed: one file per condition, whatever the sharding was.
            write_jsonl(
                store.root / condition / "merged.jsonl",
                (r for key, r in report.records.items() if key[1] == condition),
            )
        write_report([run_dir], run_dir)
    return report
