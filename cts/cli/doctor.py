"""`cts doctor`: what would break on a cluster's first sweep, checked before it is submitted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

from cts.cli.common import command, output_console
from cts.cli.options import CONFIG_OPTION, OUTPUT_DIR_OPTION, SET_OPTION, checked_output_dir, sbatch
from cts.eval.run.config import load_experiment
from cts.slurm.doctor import DoctorOptions, doctor
from cts.slurm.plan import SlurmOptions

app = typer.Typer()

#: The options `cts slurm submit` takes, to test with what will be submitted.
_SBATCH = sbatch(prefix="--slurm: ", shards=2)


@command(app, "doctor")
def doctor_command(
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    slurm: bool = typer.Option(
        False, "--slurm", help="Also ask Slurm: its version, sbatch --test-only, partitions."
    ),
    output_dir: Path | None = OUTPUT_DIR_OPTION,
    sbatch: SlurmOptions = _SBATCH,
    vllm_python: str | None = typer.Option(
        None, help="Interpreter of the vLLM venv the servers run with (default `vllm`)."
    ),
    weights_dir: Path | None = typer.Option(
        None, "--to", help="Where `cts models download` writes (default $CTS_HOME/weights)."
    ),
) -> None:
    """Check, before the first sweep, what would break it: with --slurm the Slurm version, the
    rendered scripts through `sbatch --test-only` (give the options you will submit with) and
    the partitions with their GPU types; then every model's weights (or that `cts models
    download` is needed) and their size against free disk, the vLLM and TRL versions, the file
    systems of $CTS_HOME and the run directory, and on a GPU node GPU memory against the serve
    plan. Each line says OK or what to do; exit 1 when anything needs fixing."""
    resolved = load_experiment(config, set_)
    run_dir = (checked_output_dir(output_dir) or resolved.output_dir()).resolve()
    options = DoctorOptions(
        config=config or "quickstart",
        overrides=set_,
        run_dir=run_dir,
        vllm_python=vllm_python,
        weights_dir=weights_dir,
        slurm=replace(sbatch, vllm_python=vllm_python) if slurm else None,
    )
    checks = doctor(resolved, options)
    console = output_console()
    for check in checks:
        style = {"ok": "green", "fix": "red", "skip": "dim"}[check.status]
        console.print(check.line(), style=style, highlight=False, markup=False, soft_wrap=True)
    fixes = sum(c.status == "fix" for c in checks)
    console.print(
        f"{fixes} to fix" if fixes else "all OK", highlight=False, style="red" if fixes else None
    )
    if fixes:
        raise typer.Exit(1)
