"""`cts train sample | pairs | fit | all | loop | loop-step | grpo`: fine-tune a clarifier
against restore scores, once, by expert iteration, or online (GRPO). `cts train judge`,
`answerer`, `rewriter` and `searcher`: the tiny model's adapters for those roles."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from cts.cli.common import (
    command,
    command_group,
    output_console,
    print_account,
    print_summary,
    progress_for,
)
from cts.cli.options import SERVING, SHARD_OPTION, TRAIN_CONFIG, shard_of
from cts.eval.run.run_dir import Shard
from cts.serving.server_group import ServeOptions, served
from cts.train.adapters import ROLE_ADAPTERS
from cts.train.config import TrainConfig
from cts.train.fit import FitResult, fit
from cts.train.grpo import GrpoResult, downstream_models, experiment, grpo
from cts.train.grpo_resume import failure_counts, finished, grpo_dir
from cts.train.loop import MAIN, iterations, loop_step
from cts.train.loop_runner import StepDone, run_loop, run_step, sample
from cts.train.lora_sft import RoleAdapter
from cts.train.pairs import PairsResult, build_pairs, no_data_message
from cts.train.sft import write_examples

app = command_group(
    "Fine-tune a clarifier against restore scores: sample scored dialogues (an evaluation "
    "run of clarify@k, one seed per candidate), credit each turn's question with a reward, turn "
    "them into DPO pairs or SFT examples, train a LoRA adapter with TRL; iterate (loop), or train "
    "online with GRPO, each sampled question scored by the pipeline. The result is a model "
    "config to swap in with one --set."
)


def _say(line: str) -> None:
    output_console().print(line, highlight=False, soft_wrap=True)


def _sample(
    train: TrainConfig, shard: str | None = None, options: ServeOptions | None = None
) -> None:
    """Run the sampling: an evaluation run of the derived clarify@k experiment."""
    part, console = shard_of(shard), output_console()
    result = sample(train, options, part, progress_for(console), _say)
    merge_with = f"cts merge {train.samples_dir()}, then cts train pairs"
    print_account(console, result, part, merge_with, retry=False)
    if result.report is not None:  # None: a shard (`cts merge` writes the report)
        print_summary(console, result.report.summary)


def _pairs(train: TrainConfig) -> PairsResult:
    result = build_pairs(train)
    _pairs_table(result, train)
    if not result.rows:
        typer.echo(no_data_message(result.stats, train), err=True)
        raise typer.Exit(1)
    return result


def _pairs_table(result: PairsResult, train: TrainConfig) -> None:
    table = Table("statistic", "value", title=f"{train.method} data")
    for key, value in result.stats.items():
        table.add_row(key, str(value))
    console = output_console()
    console.print(table)
    if result.rows:
        console.print(f"{len(result.rows)} row(s): {result.path}; stats: {result.stats_path}")


def _fit(train: TrainConfig) -> FitResult:
    result = fit(train)
    _fit_table(result)
    return result


def _fit_table(result: FitResult) -> None:
    m: dict[str, Any] = result.metrics
    table = Table("method", "examples", "steps", "final loss", "mean loss", "seconds", "device")
    table.add_row(
        m["method"],
        str(m["examples"]),
        str(m["steps"]),
        "–" if m["final_loss"] is None else f"{m['final_loss']:.4f}",
        f"{m['train_loss']:.4f}",
        f"{m['seconds']:.0f}",
        f"{m['device']} ({m['dtype']})",
    )
    console = output_console()
    console.print(table)
    console.print(f"adapter: {result.adapter_dir}", highlight=False)
    if result.checkpoint_dir:
        console.print(f"merged checkpoint: {result.checkpoint_dir}", highlight=False)
    else:
        base = result.model_config.lora_of
        where = f"on {base}'s own server" if base else "on a server of its own for the base"
        console.print(
            f"adapter only (merge: false): served with vLLM's LoRA support {where} "
            "(cts serve / cts run --serve)",
            highlight=False,
        )
    _use_it(result.model_config_path)


def _use_it(model_config: Path, *before: str) -> None:
    """The model config's path and the one line that evaluates it."""
    output_console().print(
        "\n".join(
            [
                *before,
                f"model config: {model_config}",
                f"use it: cts run --set roles.clarifier.model={model_config.resolve()}",
            ]
        ),
        highlight=False,
        soft_wrap=True,
    )


@command(app, "sample")
def sample_command(
    train: TrainConfig = TRAIN_CONFIG,
    shard: str | None = SHARD_OPTION,
    options: ServeOptions = SERVING,
) -> None:
    """Sample and score candidate dialogues: an evaluation run into OUTPUT_DIR/samples.

    The train config's experiment runs clarify@k (k = `turns`, sequential) on its `split`, with
    one seed per candidate and the clarifier at the config's temperature: each record is one
    dialogue with the restore score its search reached; with `reward.baseline: blurred` the
    blurred condition runs under the same seeds. Like `cts run` it resumes, survives SIGTERM,
    shards with --shard (then `cts merge OUTPUT_DIR/samples`) and serves models with --serve."""
    _sample(train, shard, options)


@command(app, "pairs")
def pairs_command(train: TrainConfig = TRAIN_CONFIG) -> None:
    """Turn the scored samples into training data: OUTPUT_DIR/pairs.jsonl (DPO) or sft.jsonl.

    A dialogue's reward is its restore gain over the instance's blurred score less
    `reward.question_cost` per question and `reward.unknown_cost` per `unknown` answer. Each
    turn's action (a question, or a stop with `allow_stop`) is a candidate of its state (the
    turns before it) with the mean reward of the dialogues through it; the same question under
    several seeds is one candidate. DPO pairs the best action of a state with the worst (or
    every other: `pairing`) when at least `min_margin` apart; SFT keeps each state's best
    action when its reward is above `sft_min_score`. Prompts are exactly the clarifier's
    messages at that turn. candidates.jsonl lists every candidate with its reward's parts;
    pairs_stats.json counts states, candidates, pairs and skips; no data exits 1 with why."""
    _pairs(train)


@command(app, "fit")
def fit_command(train: TrainConfig = TRAIN_CONFIG) -> None:
    """Train a LoRA adapter on the clarifier's base checkpoint with TRL (DPO or SFT).

    Writes OUTPUT_DIR/adapter/, with `merge: true` OUTPUT_DIR/checkpoint/ (the merged model),
    OUTPUT_DIR/clarifier.yaml (a model config: swap it in with
    `cts run --set roles.clarifier.model=OUTPUT_DIR/clarifier.yaml`, an absolute path) and
    train_metrics.json. Runs on a GPU when there is one, on the CPU otherwise."""
    _fit(train)


@command(app, "all")
def all_command(train: TrainConfig = TRAIN_CONFIG) -> None:
    """sample → pairs → fit in one process, unsharded (a laptop, or one GPU node).

    Each step is the command of the same name; rerunning resumes the sampling."""
    _sample(train)
    _pairs(train)
    _fit(train)


def _grpo(train: TrainConfig, options: ServeOptions) -> GrpoResult | None:
    console = output_console()
    done = finished(train)
    if done is not None:
        console.print(f"trained before with this config: {done}", highlight=False)
        return None
    resolved = experiment(train)
    g = train.grpo
    console.print(
        f"GRPO: {g.max_steps} steps of {g.prompts_per_step} queries x {g.num_generations} "
        f"questions, each scored by experiment [bold]{resolved.experiment.name}[/bold]'s "
        f"pipeline ({resolved.experiment.dataset.path} split {resolved.experiment.dataset.split})"
        f" → {grpo_dir(train)}",
        highlight=False,
    )
    logs = grpo_dir(train) / "logs" / "serve"
    starting = lambda n: console.print(f"starting {n} vLLM server(s)")  # noqa: E731
    with served(downstream_models(resolved), options, logs, starting) as (urls, _):
        result = grpo(train, resolved.with_endpoints(urls))
    m = result.metrics
    # Invalid questions are priced invalid_reward in their groups; left out: failed after
    # the question, in no group.
    invalid, left_out = failure_counts(m["rollout_failures"])
    table = Table(
        "method",
        "steps",
        "final loss",
        "mean reward",
        "invalid questions",
        "left out",
        "seconds",
        "device",
    )
    rewards = [e["reward"] for e in m["log"] if "reward" in e]
    table.add_row(
        "grpo",
        str(m["steps"]),
        "–" if m["final_loss"] is None else f"{m['final_loss']:.4f}",
        f"{sum(rewards) / len(rewards):.2f}" if rewards else "–",
        str(invalid),
        str(left_out),
        f"{m['seconds']:.0f}",
        f"{m['device']} ({m['dtype']})",
    )
    console.print(table)
    if result.resumed_from:
        console.print(f"resumed from {result.resumed_from}", highlight=False)
    _use_it(
        result.model_config_path,
        f"rollouts: {result.output / 'rollouts.jsonl'}; metrics: "
        f"{result.output / 'grpo_metrics.json'}",
    )
    return result


@command(app, "grpo")
def grpo_command(
    train: TrainConfig = TRAIN_CONFIG,
    options: ServeOptions = SERVING,
) -> None:
    """Online RL (GRPO) of the clarifier's first question, rewarded end to end.

    Each step samples `grpo.num_generations` questions for each of `grpo.prompts_per_step`
    training queries (the `split`) from the current policy, under the clarifier's JSON schema,
    and puts each through the experiment's own User Answerer, Rewriter, search and judge
    (clarify@1 under seed i for the i-th question); its reward is `reward`'s (gain over the
    blurred score, less the price of asking and of `unknown`). A question outside the schema
    earns `grpo.invalid_reward` (the table's "invalid questions"); a failure after it is left
    out of its group ("left out"). Writes
    OUTPUT_DIR/grpo/: rollouts.jsonl (every question with its answer, score and reward's
    parts), trainer/ checkpoints every `grpo.save_steps` (a rerun resumes there; under a
    config changed in more than steps, logging or where vLLM runs, it is refused), then the
    adapter, the merged checkpoint, clarifier.yaml and grpo_metrics.json. --serve starts vLLM
    for the other roles; the policy trains in this process."""
    _grpo(train, options)


@command(app, "loop")
def loop_command(
    train: TrainConfig = TRAIN_CONFIG,
    count: int | None = typer.Option(
        None,
        "--iterations",
        min=1,
        help="Iterations to run (default: the config's loop.iterations).",
    ),
    options: ServeOptions = SERVING,
) -> None:
    """Expert iteration: sample → pairs → fit → evaluate, R times, each from the last fit.

    The base clarifier is evaluated first. Iteration i samples with iteration i−1's clarifier
    (its merged checkpoint; with merge: false and a served clarifier, its LoRA adapter on the
    base's one server) and fits on top of it (OUTPUT_DIR/iter-i/, as `cts train all` lays it
    out). Every clarifier is evaluated with the experiment's own pipeline on its own data (held
    out from the sampled split; `loop.evaluation_overrides`), and again under each
    `loop.robustness` variant (e.g. another User Answerer or judge), into
    OUTPUT_DIR/eval/<variant>/iter-i/. After each evaluation OUTPUT_DIR/loop/<variant>/ holds
    the report of the iterations so far and loop.md / loop.json: per iteration the restore score
    per condition with its CI, the paired Δ against the base and the previous iteration,
    answerability, questions asked, and the model calls and tokens spent. Rerunning resumes at
    the first unfinished step (a finished fit is not redone; finished runs make no model
    call)."""
    console = output_console()
    for done in run_loop(train, count, options, progress_for(console), _say):
        _print_step(done, Shard())


def _print_step(done: StepDone, shard: Shard) -> None:
    """What a step of the loop did: each run's account (an interrupted one exits 130), the
    pairs and fit tables, the loop table."""
    console = output_console()
    for run in done.runs:
        print_account(console, run, shard, f"cts merge {run.run_dir}", retry=False)
        if done.step.name == "sample" and run.report is not None:
            print_summary(console, run.report.summary)
    if done.fitted_before is not None:
        it = done.step.iteration.index
        _say(f"iteration {it}: fitted before: {done.fitted_before}")
    if done.pairs is not None:
        assert done.step.iteration.train is not None
        _pairs_table(done.pairs, done.step.iteration.train)
    if done.fit is not None:
        _fit_table(done.fit)
    for loop_table in done.tables:
        if loop_table.variant == MAIN:
            console.print(loop_table.markdown.read_text(), highlight=False, soft_wrap=True)
        _say(f"loop table ({loop_table.variant}): {loop_table.markdown}; report: "
             f"{loop_table.report_html}")  # fmt: skip


@command(app, "loop-step")
def loop_step_command(
    step: str = typer.Argument(
        ...,
        help="eval: iteration I's clarifier, every variant (sharded). sample: iteration I's "
        "sampling (sharded; I ≥ 1). fit: merge the samples, pairs, fit (I ≥ 1). table: merge "
        "the evaluations of iterations 0..I, write the report and loop tables.",
    ),
    iteration: int = typer.Option(..., min=0, help="The iteration I."),
    train: TrainConfig = TRAIN_CONFIG,
    count: int | None = typer.Option(
        None, "--iterations", min=1, help="The loop's iterations (default: loop.iterations)."
    ),
    shard: str | None = SHARD_OPTION,
    options: ServeOptions = SERVING,
) -> None:
    """One step of `cts train loop`, as the jobs of `cts slurm submit --job train-loop` run it.

    The same directories and resumption as `cts train loop`: a chain of eval 0, table 0, then
    per iteration sample, fit, eval, table does what one `cts train loop` process does, with
    the sampling and evaluations sharded over array tasks."""
    plan = iterations(train, count or train.loop.iterations)
    part, progress = shard_of(shard), progress_for(output_console())
    one = loop_step(plan, step, iteration)
    _print_step(run_step(train, plan, one, options, part, True, progress, _say), part)


def _role_fit_command(adapter: RoleAdapter) -> None:
    """Register `cts train ROLE`: a LoRA fit of the tiny model for one role, its options'
    defaults those of the role's settings; with --write-data, the role's data module writes
    the generated examples instead."""
    defaults, data, what = adapter.settings, adapter.data, adapter.what

    def run(
        examples: int = typer.Option(defaults.examples, help=f"Labelled {what} to generate."),
        seed: int = typer.Option(defaults.seed, help="Seeds the data generator and the trainer."),
        epochs: float = typer.Option(defaults.epochs, help="Passes over the examples."),
        learning_rate: float = typer.Option(defaults.learning_rate, help="The LoRA learning rate."),
        max_steps: int = typer.Option(0, help="Stop after this many optimizer steps (0: all)."),
        max_seconds: float = typer.Option(
            0.0, help="Stop at the first step end after this many seconds (0: no limit)."
        ),
        output: Path = typer.Option(adapter.adapter_dir, help="Where the adapter is written."),
        write_data: Path | None = typer.Option(
            None,
            help="Only write the generated examples (JSONL) here; no training.",
        ),
    ) -> None:
        if write_data is not None:
            generated = data.generate(examples, seed)
            write_examples(generated, write_data)
            labels = data.label_counts(generated)
            typer.echo(f"{len(generated)} examples, labels {labels}: {write_data}")
            return
        settings = replace(
            defaults,
            examples=examples,
            seed=seed,
            epochs=epochs,
            learning_rate=learning_rate,
            max_steps=max_steps,
            max_seconds=max_seconds,
        )
        record = adapter.fit(settings, output)
        typer.echo(
            f"adapter: {output} ({record['steps']} steps on {examples} examples, "
            f"{record['seconds']:.0f} s, train loss {record['train_loss']:.3f})"
        )

    run.__doc__ = adapter.doc
    command(app, adapter.role)(run)


for _adapter in ROLE_ADAPTERS:
    _role_fit_command(_adapter)
