"""The training loop run from Python: each step of `cts.train.loop.loop_steps` done, in order.

`cts train loop` iterates `run_loop`, `cts train loop-step` calls `run_step` once, and each
job of the Slurm chain (`cts/slurm/kinds.train_loop_jobs`) is one `run_step`; a notebook can
do the same:

    from cts.train.config import load_train_config
    from cts.train.loop_runner import run_loop

    for done in run_loop(load_train_config("quickstart"), count=2):
        print(done.step.name, done.step.iteration.index, done.records_written)

A step's runs (sampling, evaluations) are ordinary evaluation runs: they resume, and a
signal stops them with their finished records kept (`StepDone.interrupted`; the loop stops
there). Models are reached as `options` says (`cts.eval.experiment.serve_and_run`). What a step
did comes back as a `StepDone` to print or inspect; `notify` is told, as a line of text,
what is about to run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cts.eval.data.dataset import load_instances
from cts.eval.experiment import RunResult, merge_run, serve_and_run
from cts.eval.report.report import write_report
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.progress import ShowProgress
from cts.eval.run.run_dir import Shard
from cts.serving.server_group import ServeOptions
from cts.train.config import TrainConfig
from cts.train.fit import FitResult, fit
from cts.train.held_out import roles_fitted_on
from cts.train.loop import (
    Iteration,
    LoopError,
    LoopStep,
    evaluation,
    iterations,
    loop_steps,
    table,
    variants,
    write_table,
)
from cts.train.pairs import PairsError, PairsResult, build_pairs, no_data_message
from cts.train.sample import sampling_experiment

Notify = Callable[[str], None]


@dataclass(frozen=True)
class LoopTable:
    """One variant's loop table over the iterations so far, and the report beside it."""

    variant: str
    markdown: Path
    json: Path
    report_html: Path


@dataclass
class StepDone:
    """What one step did."""

    step: LoopStep
    #: The evaluation runs (eval: one per variant) or the sampling run (sample).
    runs: list[RunResult] = field(default_factory=list)
    pairs: PairsResult | None = None
    fit: FitResult | None = None
    #: fit: the clarifier a finished fit had left (nothing fitted again).
    fitted_before: Path | None = None
    tables: list[LoopTable] = field(default_factory=list)

    @property
    def interrupted(self) -> bool:
        return any(run.outcome.interrupted for run in self.runs)

    @property
    def records_written(self) -> int:
        return sum(run.outcome.ran for run in self.runs)


def _run(
    resolved: ResolvedExperiment,
    run_dir: Path,
    options: ServeOptions | None,
    shard: Shard | None,
    show_progress: ShowProgress,
    notify: Notify,
) -> RunResult:
    starting = lambda n: notify(f"starting {n} vLLM server(s)")  # noqa: E731
    return serve_and_run(
        resolved,
        run_dir,
        serve=options,
        starting=starting,
        notify=notify,
        shard=shard or Shard(),
        show_progress=show_progress,
    )


def sample(
    train: TrainConfig,
    options: ServeOptions | None = None,
    shard: Shard | None = None,
    show_progress: ShowProgress = True,
    notify: Notify = lambda line: None,
) -> RunResult:
    """The sampling: an evaluation run of the train config's clarify@k experiment into
    OUTPUT_DIR/samples (what `cts train sample` runs)."""
    resolved = sampling_experiment(train)
    run_dir = train.samples_dir()
    dataset = resolved.experiment.dataset
    for fitted in roles_fitted_on(resolved, load_instances(dataset)):
        notify("WARNING " + fitted.describe())
    notify(
        f"sampling {train.candidates} clarify@{train.turns} dialogues per instance at "
        f"temperature {train.temperature:g}: experiment {resolved.experiment.name}, "
        f"{dataset.path} split {dataset.split} → {run_dir}"
    )
    return _run(resolved, run_dir, options, shard, show_progress, notify)


def pairs(train: TrainConfig) -> PairsResult:
    """The samples as training data; none is a PairsError saying why, in numbers."""
    result = build_pairs(train)
    if not result.rows:
        raise PairsError(no_data_message(result.stats, train))
    return result


def evaluate(
    train: TrainConfig,
    iteration: Iteration,
    options: ServeOptions | None = None,
    shard: Shard | None = None,
    show_progress: ShowProgress = True,
    notify: Notify = lambda line: None,
) -> list[RunResult]:
    """Iteration's clarifier through the experiment's own pipeline, once per variant; stops
    after a run a signal interrupted."""
    results = []
    for variant in variants(train):
        resolved = evaluation(train, iteration, variant)
        run_dir = iteration.eval_dir(variant)
        notify(
            f"iteration {iteration.index}: evaluating {resolved.clarifier_label()} "
            f"({variant}) → {run_dir}"
        )
        result = _run(resolved, run_dir, options, shard, show_progress, notify)
        results.append(result)
        if result.outcome.interrupted:
            break
    return results


def merged(run_dir: Path) -> None:
    """A sharded run's merge (summary and report), as `cts merge` does it; a key missing or
    recorded twice is a LoopError naming the run and the first such keys."""
    report = merge_run(run_dir)
    if not report.ok:
        keys = [*report.missing[:3], *report.duplicates[:3]]
        raise LoopError(
            f"{run_dir}: {len(report.missing)} missing and {len(report.duplicates)} duplicated "
            f"key(s), e.g. {keys}: its shards did not all finish (submit again: finished "
            "records are kept)"
        )


def loop_tables(train: TrainConfig, done: list[Iteration]) -> list[LoopTable]:
    """Per variant: the report of the evaluated iterations together, and the loop table."""
    tables = []
    for variant in variants(train):
        dirs = [it.eval_dir(variant) for it in done]
        out = train.resolved_output_dir() / "loop" / variant
        written = write_report(dirs, out)
        rows = table(written.summary, done, dirs)
        json_path, md = write_table(out, rows, variant)
        tables.append(LoopTable(variant, md, json_path, written.html))
    return tables


def run_step(
    train: TrainConfig,
    plan: list[Iteration],
    step: LoopStep,
    options: ServeOptions | None = None,
    shard: Shard | None = None,
    chained: bool = False,
    show_progress: ShowProgress = True,
    notify: Notify = lambda line: None,
) -> StepDone:
    """One step of the loop. `chained`: a job of a chain, whose sharded runs before it are
    merged first (one process's loop runs them whole)."""
    it, done = step.iteration, StepDone(step)
    if step.name == "eval":
        done.runs = evaluate(train, it, options, shard, show_progress, notify)
    elif step.name == "table":
        if chained:
            for earlier in plan[: it.index + 1]:
                for variant in variants(train):
                    merged(earlier.eval_dir(variant))
        done.tables = loop_tables(train, plan[: it.index + 1])
    elif step.name == "sample":
        assert it.train is not None
        done.runs = [sample(it.train, options, shard, show_progress, notify)]
    elif it.fitted():
        done.fitted_before = it.clarifier()
    else:
        assert it.train is not None
        if chained:
            merged(step.records_dir())
        done.pairs = pairs(it.train)
        done.fit = fit(it.train)
    return done


def run_loop(
    train: TrainConfig,
    count: int | None = None,
    options: ServeOptions | None = None,
    show_progress: ShowProgress = True,
    notify: Notify = lambda line: None,
) -> Iterator[StepDone]:
    """Expert iteration, `count` iterations (default `loop.iterations`): every step in order,
    each yielded once done; a run a signal interrupted ends the loop (rerun to resume: no
    finished step is redone)."""
    plan = iterations(train, count or train.loop.iterations)
    for step in loop_steps(plan):
        done = run_step(train, plan, step, options, None, False, show_progress, notify)
        yield done
        if done.interrupted:
            return
