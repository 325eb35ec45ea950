"""`cts train sample | pairs | fit | all | loop | loop-step | grpo`: fine-tune a clarifier
against restore scores, once, by expert iteration, or online (GRPO). `cts train judge`,
`answerer`, `rewriter` and `searcher`: the tiny model's adapters for those roles."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from cts.common import (
    SERVING,
    SHARD_OPTION,
    command,
    output_console,
    print_summary,
    run_into,
    run_keyed,
    shard_of,
)
from eval.experiment import merge_run
from eval.report.report import write_report
from eval.report.summary import read_summary
from eval.run.run_dir import RunDir
from serving.serve import ServeOptions, served
from train.adapters import ROLE_ADAPTERS
from train.config import TrainConfig, load_train_config
from train.fit import FitResult, fit
from train.grpo import GrpoResult, downstream_models, experiment, finished, grpo, grpo_dir
from train.loop import (
    MAIN,
    Iteration,
    LoopError,
    LoopStep,
    evaluation,
    iterations,
    loop_step,
    loop_steps,
    table,
    variants,
    write_table,
)
from train.lora_sft import RoleAdapter
from train.pairs import PairsResult, build_pairs, no_data_message
from train.sample import sampling_experiment

app = typer.Typer(
    help="Fine-tune a clarifier against restore scores: sample scored dialogues (an evaluation "
    "run of clarify@k, one seed per candidate), credit each turn's question with a reward, turn "
    "them into DPO pairs or SFT examples, train a LoRA adapter with TRL; iterate (loop), or train "
    "online with GRPO, each sampled question scored by the pipeline. The result is a model "
    "config to swap in with one --set.",
    no_args_is_help=True,
)

CONFIG_OPTION = typer.Option(
    None,
    "--config",
    "-c",
    help="Train YAML (a path, or a name under configs/train/). Default: quickstart.",
)
SET_OPTION = typer.Option(
    [],
    "--set",
    help="Override a train config key, e.g. --set method=sft --set limit=10 (repeatable).",
)


def _sample(
    train: TrainConfig, shard: str | None = None, options: ServeOptions | None = None
) -> None:
    """Run the sampling: an evaluation run of the derived clarify@k experiment."""
    resolved = sampling_experiment(train)
    part = shard_of(shard)
    run = RunDir(train.samples_dir())
    console = output_console()
    dataset = resolved.experiment.dataset
    console.print(
        f"sampling {train.candidates} clarify@{train.turns} dialogues per instance at temperature "
        f"{train.temperature:g}: experiment [bold]{resolved.experiment.name}[/bold], "
        f"{dataset.path} split {dataset.split} → {run.root}",
        highlight=False,
    )
    result = run_keyed(
        resolved,
        run,
        part,
        options or ServeOptions(),
        run_into(run.root),
        console,
        merge_with=f"cts merge {run.root}, then cts train pairs",
    )
    if result.report is None:  # a shard: `cts merge` writes the report
        return
    print_summary(console, result.report["summary"])


def _pairs(train: TrainConfig) -> PairsResult:
    result = build_pairs(train)
    table = Table("statistic", "value", title=f"{train.method} data")
    for key, value in result.stats.items():
        table.add_row(key, str(value))
    console = output_console()
    console.print(table)
    if not result.rows:
        typer.echo(no_data_message(result.stats, train), err=True)
        raise typer.Exit(1)
    console.print(f"{len(result.rows)} row(s): {result.path}; stats: {result.stats_path}")
    return result


def _fit(train: TrainConfig) -> FitResult:
    result = fit(train)
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
        console.print(
            "adapter only (merge: false): the model config serves it with vLLM's LoRA support "
            "(cts serve / cts run --serve)",
            highlight=False,
        )
    _use_it(result.model_config_path)
    return result


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
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    shard: str | None = SHARD_OPTION,
    options: ServeOptions = SERVING,
) -> None:
    """Sample and score candidate dialogues: an evaluation run into OUTPUT_DIR/samples.

    The train config's experiment runs clarify@k (k = `turns`, sequential) on its `split`, with
    one seed per candidate and the clarifier at the config's temperature: each record is one
    dialogue with the restore score its search reached; with `reward.baseline: blurred` the
    blurred condition runs under the same seeds. Like `cts run` it resumes, survives SIGTERM,
    shards with --shard (then `cts merge OUTPUT_DIR/samples`) and serves models with --serve."""
    _sample(load_train_config(config, set_), shard, options)


@command(app, "pairs")
def pairs_command(config: str | None = CONFIG_OPTION, set_: list[str] = SET_OPTION) -> None:
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
    _pairs(load_train_config(config, set_))


@command(app, "fit")
def fit_command(config: str | None = CONFIG_OPTION, set_: list[str] = SET_OPTION) -> None:
    """Train a LoRA adapter on the clarifier's base checkpoint with TRL (DPO or SFT).

    Writes OUTPUT_DIR/adapter/, with `merge: true` OUTPUT_DIR/checkpoint/ (the merged model),
    OUTPUT_DIR/clarifier.yaml (a model config: swap it in with
    `cts run --set roles.clarifier.model=OUTPUT_DIR/clarifier.yaml`, an absolute path) and
    train_metrics.json. Runs on a GPU when there is one, on the CPU otherwise."""
    _fit(load_train_config(config, set_))


@command(app, "all")
def all_command(config: str | None = CONFIG_OPTION, set_: list[str] = SET_OPTION) -> None:
    """sample → pairs → fit in one process, unsharded (a laptop, or one GPU node).

    Each step is the command of the same name; rerunning resumes the sampling."""
    train = load_train_config(config, set_)
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
    table = Table("method", "steps", "final loss", "mean reward", "unscorable", "seconds", "device")
    rewards = [e["reward"] for e in m["log"] if "reward" in e]
    table.add_row(
        "grpo",
        str(m["steps"]),
        "–" if m["final_loss"] is None else f"{m['final_loss']:.4f}",
        f"{sum(rewards) / len(rewards):.2f}" if rewards else "–",
        str(sum(m["rollout_failures"].values())),
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
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    options: ServeOptions = SERVING,
) -> None:
    """Online RL (GRPO) of the clarifier's first question, rewarded end to end.

    Each step samples `grpo.num_generations` questions for each of `grpo.prompts_per_step`
    training queries (the `split`) from the current policy, under the clarifier's JSON schema,
    and puts each through the experiment's own User Answerer, Rewriter, search and judge
    (clarify@1 under seed i for the i-th question); its reward is `reward`'s (gain over the
    blurred score, less the price of asking and of `unknown`). A question outside the schema
    earns `grpo.invalid_reward`; a failure after it is left out of its group. Writes
    OUTPUT_DIR/grpo/: rollouts.jsonl (every question with its answer, score and reward's
    parts), trainer/ checkpoints every `grpo.save_steps` (a rerun resumes there), then the
    adapter, the merged checkpoint, clarifier.yaml and grpo_metrics.json. --serve starts vLLM
    for the other roles; the policy trains in this process."""
    _grpo(load_train_config(config, set_), options)


def _evaluate(
    train: TrainConfig, iteration: Iteration, options: ServeOptions, shard: str | None = None
) -> None:
    """Iteration's clarifier through the experiment's own pipeline, once per variant."""
    console = output_console()
    for variant in variants(train):
        resolved = evaluation(train, iteration, variant)
        run = RunDir(iteration.eval_dir(variant))
        console.print(
            f"[bold]iteration {iteration.index}[/bold]: evaluating {resolved.clarifier_label()} "
            f"({variant}) → {run.root}",
            highlight=False,
        )
        run_keyed(
            resolved, run, shard_of(shard), options, run_into(run.root), console,
            merge_with=f"cts merge {run.root}",
        )  # fmt: skip


def _loop_tables(train: TrainConfig, done: list[Iteration]) -> None:
    """Per variant: the report of the evaluated iterations together, and the loop table."""
    console = output_console()
    root = train.resolved_output_dir() / "loop"
    for variant in variants(train):
        dirs = [it.eval_dir(variant) for it in done]
        out = root / variant
        files = write_report(dirs, out)
        rows = table(read_summary(files["summary"]), done, dirs)
        _, md = write_table(out, rows, variant)
        if variant == MAIN:
            console.print(md.read_text(), highlight=False, soft_wrap=True)
        console.print(f"loop table ({variant}): {md}; report: {files['html']}", highlight=False)


def _merged(run_dir: Path) -> None:
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


@command(app, "loop")
def loop_command(
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
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
    (its merged checkpoint) and fits a new adapter on top of it (OUTPUT_DIR/iter-i/, as `cts
    train all` lays it out). Every
    clarifier is evaluated with the experiment's own pipeline on its own data (held out from
    the sampled split; `loop.evaluation_overrides`), and again under each `loop.robustness`
    variant (e.g. another User Answerer or judge), into OUTPUT_DIR/eval/<variant>/iter-i/.
    After each evaluation OUTPUT_DIR/loop/<variant>/ holds the report of the iterations so far
    and loop.md / loop.json: per iteration the restore score per condition with its CI, the
    paired Δ against the base and the previous iteration, answerability, questions asked, and
    the model calls and tokens spent. Rerunning resumes at the first unfinished step (a
    finished fit is not redone; finished runs make no model call)."""
    train = load_train_config(config, set_)
    plan = iterations(train, count or train.loop.iterations)
    for step in loop_steps(plan):
        _run_step(train, plan, step, options)


def _run_step(
    train: TrainConfig,
    plan: list[Iteration],
    step: LoopStep,
    options: ServeOptions,
    shard: str | None = None,
    chained: bool = False,
) -> None:
    """One step of the loop. `chained`: a job of a chain, whose sharded runs before it are
    merged first (one process's loop runs them whole)."""
    it = step.iteration
    if step.name == "eval":
        _evaluate(train, it, options, shard)
    elif step.name == "table":
        if chained:
            for done in plan[: it.index + 1]:
                for variant in variants(train):
                    _merged(done.eval_dir(variant))
        _loop_tables(train, plan[: it.index + 1])
    elif step.name == "sample":
        assert it.train is not None
        _sample(it.train, shard, options)
    elif it.fitted():
        output_console().print(
            f"iteration {it.index}: fitted before: {it.clarifier()}", highlight=False
        )
    else:
        assert it.train is not None
        if chained:
            _merged(step.records_dir())
        _pairs(it.train)
        _fit(it.train)


@command(app, "loop-step")
def loop_step_command(
    step: str = typer.Argument(
        ...,
        help="eval: iteration I's clarifier, every variant (sharded). sample: iteration I's "
        "sampling (sharded; I ≥ 1). fit: merge the samples, pairs, fit (I ≥ 1). table: merge "
        "the evaluations of iterations 0..I, write the report and loop tables.",
    ),
    iteration: int = typer.Option(..., "--iteration", min=0, help="The iteration I."),
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
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
    train = load_train_config(config, set_)
    plan = iterations(train, count or train.loop.iterations)
    _run_step(train, plan, loop_step(plan, step, iteration), options, shard, chained=True)


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
        output: Path = typer.Option(
            adapter.adapter_dir, "--output", help="Where the adapter is written."
        ),
        write_data: Path | None = typer.Option(
            None,
            "--write-data",
            help="Only write the generated examples (JSONL) here; no training.",
        ),
    ) -> None:
        if write_data is not None:
            generated = data.generate(examples, seed)
            data.write_examples(generated, write_data)
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
