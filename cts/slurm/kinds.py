"""The job of each `cts slurm submit --job` kind: evaluation (`cts run`, then `cts merge`),
golden construction (`cts golden build`, then `cts golden merge`), re-judging a finished run
(`cts rejudge`, then `cts merge`), building (`cts data fuse|blur` per shard, then once more
unsharded), clarifier fine-tuning (`cts train sample`, then pairs and fit on GPUs) and the train
loop (a chain of `cts train loop-step` jobs); and `plan_job`, which picks one from the command
line's --job.

Apart from the options and the job's shape (cts.slurm.plan): a new kind, or a kind's commands,
changes here, not what Slurm is asked or how a job is rendered (cts.slurm.render) and submitted
(cts.slurm.chain).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal, cast

from cts.eval.construct.fuse import parts_dir
from cts.eval.construct.store import BUILD_STEPS
from cts.eval.rejudge import rejudge_experiment
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.eval.run.run_dir import RunDir
from cts.serving.server_group import DEFAULT_READY_TIMEOUT_S
from cts.slurm.plan import (
    SHARED_WAIT_MARGIN_S,
    Job,
    SlurmOptionError,
    SlurmOptions,
    serve_flags,
    shared_servers,
)
from cts.slurm.render import freeze_train, frozen_text
from cts.train.config import load_train_config
from cts.train.loop import LoopStep, iterations, loop_steps


def _experiment_job(
    kind: Literal["eval", "golden", "rejudge"],
    resolved: ResolvedExperiment,
    run_dir: Path,
    options: SlurmOptions,
    command: list[str],
    final: list[str],
    titles: tuple[str, str],
    keys_per_instance: int,
    slurm_dir: Path | None,
) -> Job:
    slurm_dir = slurm_dir or RunDir(run_dir).slurm
    frozen = slurm_dir / "experiment.yaml"
    where = ["--config", str(frozen), "--output-dir", str(run_dir)]
    shared = shared_servers(resolved, run_dir, frozen, options)
    if shared is not None:
        ready = options.ready_timeout_s or DEFAULT_READY_TIMEOUT_S
        wait = f"{ready + SHARED_WAIT_MARGIN_S:g}"
        where += ["--endpoints", str(shared.endpoints), "--endpoints-wait", wait]
    return Job(
        kind=kind,
        run_dir=run_dir,
        shared=shared,
        array_title=titles[0],
        final_title=titles[1],
        array_args=[*command, *where, *serve_flags(options)],
        final_args=[[*final, str(run_dir)]],
        final_template="merge.sbatch",
        records_dir=run_dir,
        experiment_file=frozen,
        keys_per_instance=keys_per_instance,
        slurm_dir=slurm_dir,
        frozen={frozen.name: frozen_text(resolved, run_dir)},
        relocate=lambda d: _experiment_job(
            kind, resolved, run_dir, options, command, final, titles, keys_per_instance, d
        ),
    )


def eval_job(
    resolved: ResolvedExperiment,
    run_dir: Path,
    options: SlurmOptions,
    slurm_dir: Path | None = None,
) -> Job:
    """Evaluation: `cts run` per shard, then `cts merge` (summary, report)."""
    keys = len(resolved.experiment.conditions) * len(resolved.experiment.seeds)
    titles = ("evaluation", "merge")
    return _experiment_job(
        "eval", resolved, run_dir, options, ["run"], ["merge"], titles, keys, slurm_dir
    )


def golden_job(
    resolved: ResolvedExperiment,
    run_dir: Path,
    options: SlurmOptions,
    slurm_dir: Path | None = None,
) -> Job:
    """Golden construction: `cts golden build` per shard, then `cts golden merge` (writes
    RUN_DIR/dataset.jsonl). One record per instance."""
    titles = ("golden construction", "golden merge")
    command, final = ["golden", "build"], ["golden", "merge"]
    return _experiment_job(
        "golden", resolved, run_dir, options, command, final, titles, 1, slurm_dir
    )


def rejudge_job(
    resolved: ResolvedExperiment,
    source: Path,
    run_dir: Path,
    options: SlurmOptions,
    slurm_dir: Path | None = None,
) -> Job:
    """Re-judging: `cts rejudge SOURCE` per shard (only the judge's model is served), then
    `cts merge` (summary, report). `resolved` is the rejudge's experiment
    (cts.eval.rejudge.rejudge_experiment), frozen like an evaluation's."""
    keys = len(resolved.experiment.conditions) * len(resolved.experiment.seeds)
    titles = ("rejudge", "merge")
    command = ["rejudge", str(source)]
    return _experiment_job(
        "rejudge", resolved, run_dir, options, command, ["merge"], titles, keys, slurm_dir
    )


#: What a building job (`cts data fuse|blur`, with the arguments given after `--`) sets itself.
_SET_BY_SUBMIT = ("--shard", "--config", "-c", "--set", "--serve", "--endpoints")


def _build_out(kind: str, args: Sequence[str]) -> Path:
    """The `--out` of a `cts data fuse|blur` argument list; SlurmOptionError without one, or
    with an option the job sets itself."""
    taken = [a for a in args if a.split("=", 1)[0] in _SET_BY_SUBMIT]
    if taken:
        raise SlurmOptionError(
            f"--job {kind}: {', '.join(taken)} after -- : the job sets it (give --config and "
            "--set to cts slurm submit)"
        )
    for i, arg in enumerate(args):
        if arg.startswith("--out="):
            return Path(arg.split("=", 1)[1]).resolve()
        if arg == "--out" and i + 1 < len(args):
            return Path(args[i + 1]).resolve()
    raise SlurmOptionError(
        f"--job {kind}: give the command's arguments after --, e.g. -- FILE --out OUT"
    )


def build_job(
    kind: Literal["fuse", "blur"],
    resolved: ResolvedExperiment,
    args: Sequence[str],
    options: SlurmOptions,
    slurm_dir: Path | None = None,
) -> Job:
    """`cts data fuse|blur ARGS` per shard (rows into OUT.parts/), then the same command
    unsharded: nothing is left to run, so it serves nothing and writes OUT (and, for blur, the
    rejects and the summary)."""
    run_dir = parts_dir(_build_out(kind, args))
    slurm_dir = slurm_dir or RunDir(run_dir).slurm
    frozen = slurm_dir / "experiment.yaml"
    command = ["data", kind, *args, "--config", str(frozen)]
    return Job(
        kind=kind,
        run_dir=run_dir,
        array_title=f"{kind} rows",
        final_title=f"{kind} output",
        array_args=[*command, *serve_flags(options)],
        final_args=[command],
        final_template="merge.sbatch",
        records_dir=run_dir,
        experiment_file=frozen,
        keys_per_instance=1,
        slurm_dir=slurm_dir,
        frozen={frozen.name: frozen_text(resolved, run_dir)},
        relocate=lambda d: build_job(kind, resolved, args, options, d),
    )


def train_job(
    config: str | None,
    overrides: list[str],
    output_dir: Path | None,
    options: SlurmOptions,
    slurm_dir: Path | None = None,
) -> tuple[Job, str]:
    """Clarifier fine-tuning: `cts train sample` per shard; then, on `fit_gpus` GPUs, `cts
    merge` of the samples (their report), `cts train pairs` and `cts train fit`. The train
    config is frozen with its experiment (models inlined) beside it."""
    train = load_train_config(config, overrides)
    run_dir = (output_dir or train.resolved_output_dir()).resolve()
    slurm_dir = slurm_dir or RunDir(run_dir).slurm
    frozen, texts, sampling = freeze_train(train, run_dir, slurm_dir)
    samples_file = slurm_dir / "samples_experiment.yaml"
    # What the samples cover (the derived clarify@k experiment), for `cts slurm status`.
    texts[samples_file.name] = frozen_text(sampling, frozen.samples_dir())
    config_args = ["--config", str(slurm_dir / "train.yaml")]
    job = Job(
        kind="train",
        run_dir=run_dir,
        array_title="sampling",
        final_title="fine-tuning",
        array_args=["train", "sample", *config_args, *serve_flags(options)],
        final_args=[
            ["merge", str(frozen.samples_dir())],
            ["train", "pairs", *config_args],
            ["train", "fit", *config_args],
        ],
        final_template="train.sbatch",
        records_dir=frozen.samples_dir(),
        experiment_file=samples_file,
        keys_per_instance=len(sampling.experiment.conditions) * len(sampling.experiment.seeds),
        slurm_dir=slurm_dir,
        frozen=texts,
        relocate=lambda d: train_job(config, overrides, run_dir, options, d)[0],
    )
    return job, train.name


def train_loop_jobs(
    config: str | None,
    overrides: list[str],
    output_dir: Path | None,
    options: SlurmOptions,
    count: int | None = None,
    slurm_dir: Path | None = None,
) -> tuple[list[Job], str]:
    """`cts train loop` as a chain, each job starting when the one before it succeeded: the
    base clarifier's evaluation (array) and its table; then per iteration i the sampling
    (array) and the fit (`fit_gpus` GPUs), the evaluation (array) and the table so far. Every
    step is `cts train loop-step`, on the frozen train config."""
    train = load_train_config(config, overrides)
    count = count or train.loop.iterations
    run_dir = (output_dir or train.resolved_output_dir()).resolve()
    slurm_dir = slurm_dir or RunDir(run_dir).slurm
    frozen, texts, _ = freeze_train(train, run_dir, slurm_dir)
    where = ["--config", str(slurm_dir / "train.yaml"), "--iterations", str(count)]

    def args(step: LoopStep) -> list[str]:
        i = str(step.iteration.index)
        return ["train", "loop-step", step.name, "--iteration", i, *where]

    def job(array: LoopStep, final: LoopStep) -> Job:
        place = len(jobs)  # in the chain: a dry run's relocated copy is the same step
        i = array.iteration.index
        evaluates = array.name == "eval"
        what = ("evaluation", "table") if evaluates else ("sampling", "fit")
        return Job(
            kind="train-loop",
            label=f"loop-{array.name}-{i}",
            run_dir=run_dir,
            array_title=f"iteration {i} {what[0]}",
            final_title=f"iteration {i} {what[1]}",
            array_args=[*args(array), *serve_flags(options)],
            final_args=[args(final)],
            final_template="merge.sbatch" if evaluates else "train.sbatch",
            records_dir=array.records_dir(),
            experiment_file=RunDir(array.records_dir()).config,
            keys_per_instance=0,
            keys_known=False,
            slurm_dir=slurm_dir,
            frozen=texts,
            relocate=lambda d: train_loop_jobs(config, overrides, run_dir, options, count, d)[0][
                place
            ],
        )

    # The loop's steps in pairs: a sharded run (array) and the step that finishes it (final).
    steps = loop_steps(iterations(frozen, count))
    jobs: list[Job] = []
    for array, final in zip(steps[::2], steps[1::2], strict=True):
        assert array.sharded and not final.sharded, (array, final)
        jobs.append(job(array, final))
    return jobs, train.name


KINDS = ("eval", "golden", "rejudge", "train", "train-loop", *BUILD_STEPS)


def plan_job(
    kind: str,
    config: str | None,
    overrides: list[str],
    output_dir: Path | None,
    options: SlurmOptions,
    source: Path | None = None,
    iterations: int | None = None,
    build_args: Sequence[str] = (),
) -> tuple[list[Job], str]:
    """The jobs to submit (one, or a train loop's chain) and their name;
    SlurmOptionError/ConfigError for a bad kind or config. `source` is the run a `rejudge` job
    judges again (its --output-dir is required); `iterations` a train loop's count;
    `build_args` a fuse or blur job's command arguments."""
    if kind not in KINDS:
        raise SlurmOptionError(f"--job {kind!r}: expected {', '.join(KINDS)}")
    if options.shared_servers and kind not in ("eval", "golden", "rejudge"):
        raise SlurmOptionError(
            f"--shared-servers: for --job eval, golden or rejudge (a {kind} job's models are "
            "served by its own tasks)"
        )
    if bool(build_args) != (kind in BUILD_STEPS):
        raise SlurmOptionError(
            "arguments after -- are a --job fuse or blur command's own (e.g. -- FILE --out OUT)"
        )
    if kind == "fuse" or kind == "blur":
        kind = cast(Literal["fuse", "blur"], kind)
        if output_dir is not None:
            raise SlurmOptionError(f"--job {kind}: its output is the --out after --")
        resolved = load_experiment(config or "build", overrides)
        return [build_job(kind, resolved, build_args, options)], resolved.experiment.name
    if (source is not None) != (kind == "rejudge"):
        raise SlurmOptionError(
            "--source names the run a rejudge job judges again: give it with --job rejudge only"
        )
    if (iterations is not None) and kind != "train-loop":
        raise SlurmOptionError("--iterations is for --job train-loop only")
    if kind == "train-loop":
        return train_loop_jobs(config, overrides, output_dir, options, iterations)
    if kind == "train":
        job, name = train_job(config, overrides, output_dir, options)
        return [job], name
    if source is not None:
        if output_dir is None:
            raise SlurmOptionError("--job rejudge needs --output-dir (a new run directory)")
        run_dir = output_dir.resolve()
        source = source.resolve()
        resolved = rejudge_experiment(source, run_dir, config, overrides)
        return [rejudge_job(resolved, source, run_dir, options)], resolved.experiment.name
    resolved = load_experiment(config, overrides)
    if kind == "golden":
        run_dir = (output_dir or resolved.golden_dir()).resolve()
        return [golden_job(resolved, run_dir, options)], resolved.experiment.name
    run_dir = (output_dir or resolved.output_dir()).resolve()
    return [eval_job(resolved, run_dir, options)], resolved.experiment.name
