"""The GPU request of `cts slurm submit` against the rules newer Slurm enforces (our test cluster
runs 22.05, which accepts more), the CPU and memory a GPU task asks by default, and the servers'
readiness deadline a task or `cts run --serve` may raise."""

from __future__ import annotations

import os
import re
import sys
import tempfile

import pytest
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.run.config import load_experiment
from cts.slurm.chain import submit_chain
from cts.slurm.kinds import eval_job, plan_job
from cts.slurm.plan import CPUS_PER_GPU, MEM_GB_PER_GPU, SlurmOptionError, SlurmOptions

# What sbatch of Slurm 23.11 to 24.x (and later) refuses in a GPU request, each with its source.
# Slurm 22.05 (our cluster) accepts the first one, so a test against it alone cannot catch it.
#
# R1  --gpus-per-task (or --tres-per-task=gres/gpu:N) needs -n/--ntasks or --gpus. sbatch says
#     "Failed to validate job spec. --gpus-per-task or --tres-per-task used without either
#     --gpus or -n/--ntasks is not allowed." (SchedMD/slurm src/interfaces/gres.c, the per-task
#     GRES check; reported on 23.11.10 in meta-pytorch/torchx PR #1100, the message).
#     man sbatch, --gpus-per-task: "This option requires an explicit task count, e.g. -n,
#     --ntasks or "--gpus=X --gpus-per-task=Y" rather than an ambiguous range of nodes with -N,
#     --nodes."
# R2  --gpus must be a multiple of --gpus-per-task ("--gpus not multiple of --gpus-per-task"),
#     and with -n as well, -n must equal gpus / gpus-per-task outside slurmctld ("Based on
#     --gpus and --gpus-per-task number of requested tasks differ from -n/--ntasks"), gres.c.
# R3  --gres=gpu:N / --gpus-per-node must be a multiple of --gpus-per-task (gres.c: "not
#     multiple of --gpus-per-task").
# R4  --gpus-per-node and --gres=gpu are mutually exclusive (man sbatch, both options' NOTE).
# R5  --cpus-per-gpu is "Not compatible with the --cpus-per-task option" (man sbatch).
# R6  --mem, --mem-per-cpu and --mem-per-gpu "are mutually exclusive" (man sbatch, --mem).


def _options(args: list[str]) -> dict[str, str]:
    found = {}
    for i, arg in enumerate(args):
        if arg in ("-n", "-N"):
            found[{"-n": "--ntasks", "-N": "--nodes"}[arg]] = args[i + 1]
        elif arg.startswith("--"):
            key, _, value = arg.partition("=")
            found[key] = value
    return found


def _count(value: str) -> int:
    """`8`, `a100:8` or `gres/gpu:a100=8` → 8."""
    return int(re.split(r"[:=]", value)[-1])


def newer_slurm_refusals(args: list[str]) -> list[str]:
    """The rules above that the sbatch arguments break (empty: newer Slurm takes them)."""
    o = _options(args)
    per_task = o.get("--gpus-per-task")
    tres = o.get("--tres-per-task", "")
    if per_task is None and "gpu" in tres:
        per_task = next(t for t in tres.split(",") if "gpu" in t)
    gres_gpu = next((g for g in o.get("--gres", "").split(",") if g.startswith("gpu")), None)
    broken = []
    if per_task is not None and "--ntasks" not in o and "--gpus" not in o:
        broken.append("R1: --gpus-per-task without -n/--ntasks or --gpus")
    if per_task is not None and "--gpus" in o:
        gpus, each = _count(o["--gpus"]), _count(per_task)
        if gpus % each:
            broken.append("R2: --gpus not a multiple of --gpus-per-task")
        elif "--ntasks" in o and int(o["--ntasks"]) != gpus // each:
            broken.append("R2: -n differs from --gpus / --gpus-per-task")
    per_node = o.get("--gpus-per-node") or gres_gpu
    if per_task is not None and per_node is not None and _count(per_node) % _count(per_task):
        broken.append("R3: GPUs per node not a multiple of --gpus-per-task")
    if "--gpus-per-node" in o and gres_gpu is not None:
        broken.append("R4: --gpus-per-node with --gres=gpu")
    if "--cpus-per-gpu" in o and "--cpus-per-task" in o:
        broken.append("R5: --cpus-per-gpu with --cpus-per-task")
    if sum(k in o for k in ("--mem", "--mem-per-cpu", "--mem-per-gpu")) > 1:
        broken.append("R6: more than one of --mem, --mem-per-cpu, --mem-per-gpu")
    return broken


def test_the_rules_catch_what_we_used_to_submit():
    """The array job's old GPU request, refused on Slurm >= 23.11 before any task started."""
    old = ["--parsable", "--requeue", "--array=0-15", "--gpus-per-task=8"]
    assert newer_slurm_refusals(old) == ["R1: --gpus-per-task without -n/--ntasks or --gpus"]
    assert newer_slurm_refusals(["--gpus=8", "--gpus-per-task=3"])[0].startswith("R2")
    assert newer_slurm_refusals(["-n", "2", "--gpus=8", "--gpus-per-task=8"])[0].startswith("R2")
    assert newer_slurm_refusals(["--ntasks=1", "--gres=gpu:4", "--gpus-per-task=8"])[0][:2] == "R3"
    assert newer_slurm_refusals(["--gpus-per-node=2", "--gres=gpu:2"])[0].startswith("R4")
    assert newer_slurm_refusals(["--cpus-per-gpu=4", "--cpus-per-task=8"])[0].startswith("R5")
    assert newer_slurm_refusals(["--mem=8G", "--mem-per-gpu=4G"])[0].startswith("R6")
    assert newer_slurm_refusals(["--tres-per-task=gres/gpu:2"])[0].startswith("R1")


@pytest.mark.parametrize("gpus", [1, 2, 8])
@pytest.mark.parametrize("kind", ["eval", "golden", "train", "train-loop"])
def test_every_rendered_gpu_request_is_one_newer_slurm_accepts(tmp_path, kind, gpus):
    options = SlurmOptions(shards=4, gpus_per_task=gpus, fit_gpus=gpus, partition="gpu")
    overrides = ["limit=2"] if kind.startswith("train") else ["dataset.limit=2"]
    jobs, name = plan_job(kind, None, overrides, tmp_path / "run", options)
    chain = submit_chain(jobs, name, options, dry_run=True, workdir=tmp_path)
    for job, done in zip(jobs, chain, strict=True):
        for which, command in done.commands.items():
            assert newer_slurm_refusals(command) == [], (kind, which, command)
        # One task, on one node (its servers listen on that node's localhost), with its GPUs;
        # so is a fine-tuning job.
        request = {"--nodes=1", "--ntasks=1", f"--gpus-per-task={gpus}"}
        assert request <= set(done.commands["array"])
        trains = job.final_template == "train.sbatch"
        assert (request <= set(done.commands["final"])) == trains
    assert any(job.final_template == "train.sbatch" for job in jobs) == kind.startswith("train")


def test_a_gpu_task_asks_for_cpus_and_memory_unless_told():
    """Site defaults (often one core, a few GB) starve five vLLM servers: with GPUs and no
    --cpus-per-task / --mem, a task asks CPUS_PER_GPU cores and MEM_GB_PER_GPU GB per GPU."""
    args = SlurmOptions(shards=2, gpus_per_task=8).array_args()
    assert f"--cpus-per-task={8 * CPUS_PER_GPU}" in args
    assert f"--mem={8 * MEM_GB_PER_GPU}G" in args
    told = SlurmOptions(shards=2, gpus_per_task=8, cpus_per_task=6, mem="500G").array_args()
    assert "--cpus-per-task=6" in told and "--mem=500G" in told
    assert not any(a.startswith(("--cpus", "--mem")) for a in SlurmOptions(shards=2).array_args())
    fit = SlurmOptions(shards=2, gpus_per_task=8, fit_gpus=2).final_args(trains=True)
    assert f"--cpus-per-task={2 * CPUS_PER_GPU}" in fit and f"--mem={2 * MEM_GB_PER_GPU}G" in fit
    merge = SlurmOptions(shards=2, gpus_per_task=8).final_args(trains=False)
    assert not any(a.startswith(("--cpus", "--mem", "--gpus", "--ntasks")) for a in merge)


def test_an_sbatch_arg_that_reshapes_the_gpu_request_is_refused():
    for extra in ("--ntasks=8", "--gpus=8", "--gres=gpu:8", "-N", "--cpus-per-gpu=4"):
        with pytest.raises(SlurmOptionError, match="cts asks for the GPUs itself"):
            SlurmOptions(shards=2, gpus_per_task=8, extra_sbatch=[extra])
    assert (
        "--qos=high" in SlurmOptions(2, gpus_per_task=8, extra_sbatch=["--qos=high"]).array_args()
    )
    assert "--gres=gpu:2" in SlurmOptions(2, extra_sbatch=["--gres=gpu:2"]).array_args()


def test_the_array_task_gets_the_ready_timeout(tmp_path):
    options = SlurmOptions(shards=2, gpus_per_task=8, ready_timeout_s=7200)
    job = eval_job(load_experiment(None, ["dataset.limit=2"]), tmp_path / "run", options)
    assert job.array_args[-3:] == ["--serve", "--ready-timeout", "7200"]


def test_cts_run_serve_waits_as_long_as_ready_timeout_says(tmp_path, monkeypatch):
    """`cts run --serve` had a fixed 1800-s deadline: a first start that downloads and compiles
    could not be given longer. A stand-in `vllm` that never becomes ready shows the deadline
    the command was given (1 s) is the one it keeps."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "vllm"
    stand_in.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CTS_VLLM_PYTHON", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    args = ["run", "--serve", "--gpus", "0", "--ready-timeout", "1"]
    args += ["--output-dir", str(tmp_path / "run"), "--set", "dataset.limit=1"]
    args += ["--set", "roles.judge.model=smollm2-135m-instruct-vllm"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "not ready after 1 s" in result.output


def test_cts_slurm_submit_takes_ready_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the dry run renders here
    args = ["slurm", "submit", "--shards", "2", "--gpus-per-task", "2", "--ready-timeout", "5400"]
    args += ["--output-dir", str(tmp_path / "run"), "--set", "dataset.limit=2", "--dry-run"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (script,) = tmp_path.glob("cts-slurm-dry-run-*/eval_array.sbatch")
    assert "--serve --ready-timeout 5400 --shard" in script.read_text()
