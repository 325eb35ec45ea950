"""`cts slurm submit|status`: the benchmark, golden construction, a rejudge or fine-tuning as
Slurm jobs."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, replace
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from cts.cli.common import command, command_group, output_console
from cts.cli.options import OUTPUT_DIR_OPTION, SBATCH, SET_OPTION
from cts.slurm.chain import Submission, submit_chain
from cts.slurm.history import submissions
from cts.slurm.kinds import plan_job
from cts.slurm.plan import Job, SlurmOptions
from cts.slurm.status import chain_status, servers_state, status

app = command_group(
    "Run the benchmark, golden construction, a rejudge or clarifier fine-tuning as Slurm jobs."
)


JOB_HELP = (
    "eval: `cts run` per shard, then `cts merge`. golden: `cts golden build` per shard, then "
    "`cts golden merge`. rejudge: `cts rejudge` of the --source run per shard (only the judge's "
    "model served), then `cts merge`; needs --output-dir. train: `cts train sample` per shard, "
    "then pairs and fit on --fit-gpus GPUs (--config is then a train config). train-loop: `cts "
    "train loop` as a chain of jobs, each after the one before succeeded: the base clarifier's "
    "evaluation per shard and its table, then per iteration the sampling per shard, the fit "
    "(--fit-gpus), the evaluation per shard and the table so far. fuse, blur: `cts data fuse` or "
    "`cts data blur` per shard with the arguments after -- (e.g. -- FUSED --out F --per-query 2; "
    "--config defaults to `build`), then the same command once more, which writes F."
)


_SUBMIT_CONFIG = typer.Option(
    None,
    "--config",
    "-c",
    help="Experiment YAML (path or name; a train config for --job train). Default: quickstart.",
)
_SUBMIT_JOB = typer.Option("eval", "--job", help=JOB_HELP)
_SUBMIT_SOURCE = typer.Option(
    None,
    "--source",
    help="--job rejudge: the finished run to judge again (--config then defaults to its "
    "config.yaml; --set changes the judge).",
)
_SUBMIT_ARRAY_PARALLELISM = typer.Option(
    None, min=1, help="At most M tasks at once (--array=0-N%M)."
)
_SUBMIT_FIT_GPUS = typer.Option(
    1, min=0, help="--job train / train-loop: GPUs of the fine-tuning job(s)."
)
_SUBMIT_ITERATIONS = typer.Option(
    None,
    "--iterations",
    min=1,
    help="--job train-loop: iterations (default: the train config's loop.iterations).",
)
_SUBMIT_CPU = typer.Option(False, "--cpu", help="Serve with the CPU build of vLLM.")
_SUBMIT_VLLM_PYTHON = typer.Option(
    None, help="Interpreter of the vLLM venv the tasks serve with (default `vllm serve`)."
)
_SUBMIT_READY_TIMEOUT = typer.Option(
    None,
    "--ready-timeout",
    min=1.0,
    help="Seconds each task's servers together may take to become ready (default 1800).",
)
_SUBMIT_SHARED_SERVERS = typer.Option(
    None,
    "--shared-servers",
    help="Roles whose models one job serves for every array task, comma-separated (e.g. "
    "judge,user_answerer): loaded once, not once per shard. Its endpoints file is in "
    "RUN_DIR/slurm/; the tasks wait for it and serve their other models themselves; a last job "
    "cancels it once every task has ended. --job eval, golden, rejudge.",
)
_SUBMIT_SHARED_GPUS = typer.Option(
    None, "--shared-gpus", min=0, help="GPUs of the shared servers job (default --gpus-per-task)."
)
_SUBMIT_SHARED_TIME = typer.Option(
    None,
    "--shared-time",
    help="sbatch --time of the shared servers job: the whole sweep's (default --time).",
)
_SUBMIT_DRY_RUN = typer.Option(
    False,
    "--dry-run",
    help="Render the scripts and frozen configs into a temporary directory; submit nothing.",
)


@command(app, "submit")
def submit_command(
    config: str | None = _SUBMIT_CONFIG,
    set_: list[str] = SET_OPTION,
    job: str = _SUBMIT_JOB,
    source: Path | None = _SUBMIT_SOURCE,
    sbatch: SlurmOptions = SBATCH,
    output_dir: Path | None = OUTPUT_DIR_OPTION,
    array_parallelism: int | None = _SUBMIT_ARRAY_PARALLELISM,
    fit_gpus: int = _SUBMIT_FIT_GPUS,
    iterations: int | None = _SUBMIT_ITERATIONS,
    cpu: bool = _SUBMIT_CPU,
    vllm_python: str | None = _SUBMIT_VLLM_PYTHON,
    ready_timeout: float | None = _SUBMIT_READY_TIMEOUT,
    shared_servers: str | None = _SUBMIT_SHARED_SERVERS,
    shared_gpus: int | None = _SUBMIT_SHARED_GPUS,
    shared_time: str | None = _SUBMIT_SHARED_TIME,
    dry_run: bool = _SUBMIT_DRY_RUN,
    build_args: list[str] = typer.Argument(
        None, help="--job fuse|blur: that command's arguments, after --.", show_default=False
    ),
) -> None:
    """Submit an array job and a final job that waits for it (afterok).

    Each task serves its models on its GPUs, runs its shard and stops its servers; jobs are
    requeued on preemption and resume. Scripts, the frozen config, logs and job ids go to
    RUN_DIR/slurm/. Submitting again on the same run directory runs only what is missing; a
    changed experiment or another --shards is refused while jobs of the latest submission are
    queued or running."""
    console = output_console()
    options = replace(
        sbatch,
        array_parallelism=array_parallelism,
        cpu=cpu,
        vllm_python=vllm_python,
        fit_gpus=fit_gpus,
        ready_timeout_s=ready_timeout,
        shared_servers=[r.strip() for r in (shared_servers or "").split(",") if r.strip()],
        shared_gpus=shared_gpus,
        shared_time=shared_time,
    )
    planned, name = plan_job(
        job, config, set_, output_dir, options, source, iterations, build_args or ()
    )
    chain = submit_chain(planned, name, options, dry_run=dry_run)
    for done in chain:
        for which, line in done.commands.items():
            prefix = f"{done.stage} {which}" if done.stage else which
            print(f"{prefix}: {shlex.join(line)}")  # unwrapped, to copy and paste
    _print_submitted(console, planned, chain, options.shards, dry_run)


def _print_submitted(
    console: Console,
    planned: list[Job],
    chain: list[Submission],
    shards: int,
    dry_run: bool,
) -> None:
    """Where a dry run rendered its scripts, or the jobs submitted and how to watch them."""
    run_dir = planned[0].run_dir
    if dry_run:
        where = Path(chain[0].scripts["array"]).parent
        console.print(
            f"scripts and frozen configs rendered in {where} (the scripts read the frozen "
            f"config there); nothing submitted and nothing written to {run_dir}",
            highlight=False,
        )
        return
    for step, done in zip(planned, chain, strict=True):
        if step.shared is not None and done.servers_job:
            console.print(
                f"submitted shared servers job {done.servers_job} "
                f"({', '.join(step.shared.models)}), cancelled by job {done.stop_job} once "
                "every array task has ended.",
                highlight=False,
            )
        console.print(
            f"submitted {step.array_title} job {done.array_job} ({shards} shards) and "
            f"{step.final_title} job {done.final_job}.",
            highlight=False,
        )
    ids = ",".join(str(j) for d in chain for j in (d.servers_job, d.array_job, d.final_job) if j)
    console.print(
        f"watch: cts slurm status {run_dir}   or   squeue -j {ids}\n"
        f"logs: {run_dir / 'slurm' / 'logs'}",
        highlight=False,
    )


@command(app, "status")
def status_command(
    run_dir: Path = typer.Argument(..., help="The run directory."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Per-shard progress (records done / expected, failed records) and Slurm job states; for
    a train loop's chain, one row per job of the chain."""
    if submissions(run_dir)[-1].get("chain"):
        _chain_status(run_dir, as_json)
        return
    latest, progress, final = status(run_dir)
    servers = servers_state(latest)
    if as_json:
        print(
            json.dumps(
                {
                    "kind": latest["kind"],
                    "array_job": latest["array_job"],
                    "final_job": latest["final_job"],
                    "final": asdict(final) if final else None,
                    "servers_job": latest.get("servers_job"),
                    "servers": asdict(servers) if servers else None,
                    "shards": [
                        {
                            "shard": p.shard.name,
                            "records": p.done,
                            "expected": p.expected,
                            "failed_records": p.failed,
                            "records_error": p.records_error,
                            "job": asdict(p.job) if p.job else None,
                        }
                        for p in progress
                    ],
                },
                indent=1,
            )
        )
        return
    table = Table("shard", "job state", "records", "failed records", "reason")
    for p in progress:
        job = p.job
        table.add_row(
            f"{p.shard.index}/{p.shard.count}",
            job.state if job else "gone from Slurm",
            f"{p.done}/{p.expected}" if p.records_error is None else "[red]unreadable[/red]",
            str(p.failed),
            p.records_error or (job.reason if job and job.reason != "None" else ""),
        )
    console = output_console()
    console.print(table)
    console.print(
        f"{latest['kind']} array job {latest['array_job']}, final job {latest['final_job']}: "
        f"{final.state if final else 'gone from Slurm'}"
        + (f" ({final.reason})" if final and final.reason not in ("", "None") else ""),
        highlight=False,
    )
    if latest.get("servers_job"):
        console.print(
            f"shared servers job {latest['servers_job']}: "
            f"{servers.state if servers else 'gone from Slurm'}",
            highlight=False,
        )
    total = sum(p.done for p in progress)
    expected = sum(p.expected for p in progress)
    console.print(f"{total}/{expected} records", highlight=False)


def _chain_status(run_dir: Path, as_json: bool) -> None:
    steps = chain_status(run_dir)
    rows = []
    for step in steps:
        sub = step.submission
        done = sum(p.done for p in step.progress)
        expected = sum(p.expected for p in step.progress)
        rows.append(
            {
                "stage": sub["stage"],
                "titles": sub["titles"],
                "array_job": sub["array_job"],
                "final_job": sub["final_job"],
                "tasks": {t: asdict(s) for t, s in step.tasks.items()},
                "final": asdict(step.final) if step.final else None,
                # The main evaluation's or the sampling's records; None before it started.
                "records": done if step.progress else None,
                "expected": expected if step.progress else None,
                "failed_records": sum(p.failed for p in step.progress),
            }
        )
    if as_json:
        print(json.dumps({"kind": steps[0].submission["kind"], "steps": rows}, indent=1))
        return
    table = Table("step", "array job", "tasks", "records", "final job", "state")
    for step, row in zip(steps, rows, strict=True):
        titles = row["titles"] or ["", ""]
        final = step.final
        table.add_row(
            f"{titles[0]} → {titles[1]}",
            str(row["array_job"]),
            step.task_states(),
            "not started"
            if row["records"] is None
            else f"{row['records']}/{row['expected']} ({row['failed_records']} failed)",
            str(row["final_job"]),
            (final.state + (f" ({final.reason})" if final.reason not in ("", "None") else ""))
            if final
            else "gone from Slurm",
        )
    output_console().print(table)
