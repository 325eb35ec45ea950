"""`cts doctor -c EXPERIMENT [--slurm]`: what a user runs on the login node before the first
sweep. With --slurm: the Slurm version, the job's rendered scripts through `sbatch --test-only`
(the cluster's own verdict on the GPU, CPU, memory and time request), the partitions and their
GPU types. Always: the weights, vLLM and TRL versions, the file systems of $CTS_HOME and the run
directory, and, on a GPU node, GPU memory against the serve plan. Each line says OK or what to
do."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from cts.eval.run.config import ResolvedExperiment
from cts.foundation.files import cts_home
from cts.serving.checks import Check, filesystems, gpu_memory, run_command, versions, weights
from cts.serving.server_plan import served_models
from cts.slurm.chain import submit_chain
from cts.slurm.kinds import plan_job
from cts.slurm.plan import SlurmOptions


@dataclass(frozen=True)
class DoctorOptions:
    #: The experiment as the user names it (for the commands the lines suggest).
    config: str
    overrides: list[str]
    run_dir: Path
    vllm_python: str | None = None
    #: The Slurm job to test (None: no Slurm checks).
    slurm: SlurmOptions | None = None
    kind: str = "eval"
    #: Where `cts models download` would write.
    weights_dir: Path | None = None


def slurm_version() -> Check:
    code, out, err = run_command(["sbatch", "--version"])
    if code != 0:
        return Check(
            "slurm", "fix", f"{err.strip() or out.strip()}: run this on a Slurm login node"
        )
    return Check("slurm", "ok", out.strip())


def partitions(options: SlurmOptions) -> list[Check]:
    """Each partition's nodes, CPUs, memory, time limit and GRES (GPU types); the one the job
    goes to must have GPUs when it asks for them."""
    code, out, err = run_command(["sinfo", "-h", "-o", "%P|%D|%c|%m|%l|%G"])
    if code != 0:
        return [Check("partitions", "fix", err.strip() or "sinfo failed")]
    checks, found = [], {}
    for line in sorted(set(out.splitlines())):
        name, nodes, cpus, mem, limit, gres = line.split("|")
        default = name.endswith("*")
        found[name.rstrip("*")] = (default, gres)
        detail = f"{nodes} node(s), {cpus} CPUs, {mem} MB, time limit {limit}, GRES {gres}"
        checks.append(Check(f"partition {name}", "ok", detail))
    wanted = options.partition or next((n for n, (d, _) in found.items() if d), None)
    gpus = max(options.gpus_per_task, options.fit_gpus if options.fit_gpus else 0)
    if wanted is not None and options.gpus_per_task and wanted in found:
        gres = found[wanted][1]
        if "gpu" not in gres:
            with_gpus = [n for n, (_, g) in found.items() if "gpu" in g] or ["none"]
            checks.append(
                Check(
                    f"partition {wanted}",
                    "fix",
                    f"has no GPUs (GRES {gres}) and the job asks {gpus} per task: --partition "
                    f"one of {', '.join(with_gpus)}",
                )
            )
    return checks


def test_only(options: DoctorOptions) -> list[Check]:
    """The job's scripts rendered as `cts slurm submit` would (into a scratch folder) and each
    sbatch command run with --test-only: the cluster says whether it would take them."""
    assert options.slurm is not None
    jobs, name = plan_job(
        options.kind, options.config, options.overrides, options.run_dir, options.slurm
    )
    chain = submit_chain(jobs, name, options.slurm, dry_run=True)
    checks = []
    try:
        for done in chain:
            for which, command in done.commands.items():
                args = [a for a in command[1:] if not a.startswith("--dependency")]
                code, out, err = run_command(["sbatch", "--test-only", *args])
                said = (err.strip() or out.strip()).replace("sbatch: ", "")
                title = f"sbatch --test-only {done.stage or done.kind} {which}"
                if code == 0:
                    checks.append(Check(title, "ok", said))
                else:
                    checks.append(
                        Check(
                            title,
                            "fix",
                            f"{said} (sbatch {' '.join(args[:-1])}): change --partition, "
                            "--gpus-per-task, --cpus-per-task, --mem or --time to what the "
                            "partition allows",
                        )
                    )
    finally:
        shutil.rmtree(Path(chain[0].scripts["array"]).parent, ignore_errors=True)
    return checks


def doctor(resolved: ResolvedExperiment, options: DoctorOptions) -> list[Check]:
    """Every check, in the order a user fixes them."""
    checks: list[Check] = []
    if options.slurm is not None:
        version = slurm_version()
        checks.append(version)
        if version.status == "ok":
            checks += test_only(options)
            checks += partitions(options.slurm)
    target = options.weights_dir or cts_home() / "weights"
    checks += weights(resolved.model_configs, options.config, target)
    serves = bool(served_models(resolved.model_configs))
    checks += versions(options.vllm_python, options.kind.startswith("train"), serves)
    paths = {"$CTS_HOME": cts_home(), "run directory": options.run_dir}
    if resolved.experiment.cache.enabled:
        paths["response cache"] = resolved.experiment.cache.resolved_path().parent
    checks += filesystems(paths)
    checks += gpu_memory(resolved.model_configs)
    return checks
