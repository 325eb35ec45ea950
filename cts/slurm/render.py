"""The text of a submission: the sbatch scripts, rendered from the templates in
cts/slurm/templates/ with every value shell-quoted (a partition, path or override containing
quotes, `$()`, `;` or spaces runs nothing unintended), and the experiment and train configs
frozen into the run's slurm/ folder, so every shard (and a requeued one) runs the same config.

Apart from the plan (cts.slurm.plan) and the submission (cts.slurm.chain): what a script says and
how a config is frozen change with the templates and the config files, not with the sbatch
options or the order jobs are submitted in. `cts_command` is looked up here: the scripts run it.
"""

from __future__ import annotations

import re
import shlex
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.eval.run.run_dir import RunDir, frozen_experiment
from cts.foundation.disk import write_whole
from cts.train.config import TrainConfig
from cts.train.sample import sampling_experiment

if TYPE_CHECKING:
    from cts.slurm.plan import Job


def cts_command() -> list[str]:
    """How a job runs `cts`: this interpreter, so the job uses the same environment."""
    return [sys.executable, "-m", "cts"]


def render(name: str, **values: str) -> str:
    """Fill the `@@key@@` slots of templates/<name> (plain bash otherwise, so `$VAR` stays as
    written). Values must already be shell-quoted."""
    text = resources.files("cts.slurm").joinpath("templates", name).read_text("utf-8")
    slots = set(re.findall(r"@@(\w+)@@", text))
    if slots != set(values):
        raise ValueError(f"template {name} has slots {sorted(slots)}, got {sorted(values)}")
    return re.sub(r"@@(\w+)@@", lambda m: values[m.group(1)], text)


def render_array(job: Job, workdir: Path) -> str:
    return render(
        "array.sbatch",
        workdir=shlex.quote(str(workdir)),
        title=shlex.quote(job.array_title),
        array_command=shlex.join([*cts_command(), *job.array_args]),
    )


def render_final(job: Job, workdir: Path) -> str:
    lines = [shlex.join([*cts_command(), *args]) for args in job.final_args]
    # exec: the last command itself receives Slurm's signals.
    lines[-1] = f"exec {lines[-1]}"
    return render(job.final_template, workdir=shlex.quote(str(workdir)), commands="\n".join(lines))


def frozen_text(resolved: ResolvedExperiment, output_dir: Path) -> str:
    """What RunDir.freeze writes, without writing into the run directory."""
    return yaml_text(frozen_experiment(resolved, output_dir))


def yaml_text(document: dict[str, Any]) -> str:
    """What RunDir.write_slurm_file writes."""
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True)


def freeze_train(
    train: TrainConfig, run_dir: Path, slurm_dir: Path
) -> tuple[TrainConfig, dict[str, str], ResolvedExperiment]:
    """The train config as the jobs read it (its experiment frozen with the models inlined
    beside it, its output dir `run_dir`), the frozen files' texts (experiment.yaml,
    train.yaml) and its sampling experiment."""
    base = load_experiment(train.experiment)
    experiment_file = slurm_dir / "experiment.yaml"
    frozen = train.model_copy(
        # A literal template: `{` and `}` in the path format to themselves.
        update={
            "experiment": str(experiment_file),
            "output_dir": str(run_dir).replace("{", "{{").replace("}", "}}"),
        }
    )
    with tempfile.TemporaryDirectory(prefix="cts-slurm-freeze-") as scratch:
        # The derived experiments load the frozen one from disk: a scratch copy.
        scratch_experiment = RunDir(Path(scratch)).freeze(base, base.output_dir())
        texts = {experiment_file.name: scratch_experiment.read_text()}
        sampling = sampling_experiment(
            frozen.model_copy(update={"experiment": str(scratch_experiment)})
        )
    texts["train.yaml"] = yaml_text(frozen.model_dump(mode="json"))
    return frozen, texts, sampling


def _write(path: Path, text: str) -> None:
    """Replace the file whole: a task starting now reads the old or the new, never half."""
    write_whole(path, text)


def write_job(job: Job, workdir: Path) -> tuple[Path, Path]:
    """Write the job's frozen configs and its array and final scripts (run in `workdir`) into its
    slurm_dir; the two scripts."""
    job.slurm_dir.mkdir(parents=True, exist_ok=True)
    for file_name, text in job.frozen.items():
        _write(job.slurm_dir / file_name, text)
    array_script = job.slurm_dir / f"{job.name}_array.sbatch"
    final_script = job.slurm_dir / f"{job.name}_final.sbatch"
    _write(array_script, render_array(job, workdir))
    _write(final_script, render_final(job, workdir))
    return array_script, final_script


def write_servers(job: Job, workdir: Path) -> tuple[Path, Path]:
    """Write the script of the job's shared servers job and that of the job that stops it (which
    names no job until `write_stop` names the submitted one); the two scripts."""
    assert job.shared is not None
    servers_script = job.slurm_dir / f"{job.name}_servers.sbatch"
    stop_script = job.slurm_dir / f"{job.name}_stop.sbatch"
    command = shlex.join([*cts_command(), *job.shared.serve_args])
    _write(
        servers_script,
        render("servers.sbatch", workdir=shlex.quote(str(workdir)), serve_command=command),
    )
    write_stop(stop_script, "<servers job>")
    return servers_script, stop_script


def write_stop(script: Path, server_job: str) -> None:
    """Write the script that cancels the shared servers job `server_job`."""
    _write(script, render("stop.sbatch", server_job=shlex.quote(server_job)))
