"""The whole `cts slurm submit` path with GPUs requested, on the GPU-shaped test cluster
(scripts/slurm_cluster.sh: 4 GRES `gpu` on dummy devices): sbatch takes the GPU request, Slurm
gives each array task its own GPUs in CUDA_VISIBLE_DEVICES, `cts run --serve` plans its servers
on them, and a stand-in `vllm` (tests/vllm_stand_in.py) records the arguments and environment
each server gets. The roles answer on scripted engines: only the serving path is under test."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cts.slurm.status import job_states
from tests.slurm.test_slurm_cluster import ROOT, cluster_up, overrides, slurm_status, wait_for

#: Two served models: the searcher across both of a task's GPUs (tensor parallel), the judge on
#: one of them beside it (0.45 + 0.45 of that GPU).
GPU_MODELS = [
    "roles.searcher.model=smollm2-135m-instruct-vllm",
    "models.smollm2-135m-instruct-vllm.vllm.tensor_parallel_size=2",
    "models.smollm2-135m-instruct-vllm.vllm.gpu_memory_utilization=0.45",
    "roles.judge.model=qwen3-8b",
    "conditions=[blurred]",
    "dataset.limit=2",
]


def stand_in_vllm(bin_dir: Path) -> None:
    """An executable `vllm` that runs tests/vllm_stand_in.py with this interpreter."""
    bin_dir.mkdir()
    script = bin_dir / "vllm"
    script.write_text(
        f'#!/bin/sh\nexec {sys.executable} {ROOT / "tests" / "vllm_stand_in.py"} "$@"\n'
    )
    script.chmod(0o755)


def recorded(record_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(record_dir.glob("*.json"))]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.slurm
def test_a_gpu_submission_serves_each_model_on_the_gpus_slurm_gave_its_task(tmp_path):
    cluster_up()
    gpus = {line.split()[1] for line in _sinfo("%P %G").splitlines()}
    assert any(g.startswith("gpu:") for g in gpus), f"no GPU GRES on the cluster: {gpus}"
    stand_in_vllm(tmp_path / "bin")
    record_dir = tmp_path / "servers"
    run_dir = tmp_path / "gpu run"
    env = {k: v for k, v in os.environ.items() if k != "CTS_VLLM_PYTHON"}  # `vllm serve`, no venv
    env |= {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"}
    env |= {"CTS_VLLM_RECORD_DIR": str(record_dir), "TMPDIR": str(tmp_path / "node-local")}
    (tmp_path / "node-local").mkdir()
    extra = [a for item in GPU_MODELS for a in ("--set", item)]
    env |= {"PYTHONPATH": str(ROOT), "CTS_SCRIPTED_DELAY_S": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.scripted_cts", "slurm", "submit", "--shards", "2",
         "--gpus-per-task", "2", "--cpus-per-task", "1", "--mem", "2G", "--ready-timeout", "120",
         "--output-dir", str(run_dir), *overrides(tmp_path), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    command = next(x for x in result.stdout.splitlines() if x.startswith("array: "))
    assert "--nodes=1 --ntasks=1 --gpus-per-task=2" in command
    line = next(x for x in result.stdout.splitlines() if x.startswith("submitted evaluation job"))
    array_job, final_job = re.findall(r"job (\d+)", line)
    wait_for([array_job, final_job], 600)

    status = slurm_status(run_dir)
    logs = "".join(p.read_text() for p in (run_dir / "slurm" / "logs").glob("*.out"))
    assert [s["job"]["state"] for s in status["shards"]] == ["COMPLETED"] * 2, (status, logs)
    assert status["final"]["state"] == "COMPLETED", (status, logs)
    assert sum(s["records"] for s in status["shards"]) == 2

    servers = recorded(record_dir)
    assert len(servers) == 4, [s["argv"] for s in servers]  # two models in each of two tasks
    by_task: dict[str, list[dict]] = {}
    for server in servers:
        by_task.setdefault(server["env"]["SLURM_ARRAY_TASK_ID"], []).append(server)
    assert sorted(by_task) == ["0", "1"]
    allocations = []
    for task, started in by_task.items():
        allocated = started[0]["env"]["SLURM_JOB_GPUS"].split(",")
        assert len(allocated) == 2, started[0]["env"]
        allocations.append(set(allocated))
        models = {flag(s["argv"], "--served-model-name"): s for s in started}
        searcher = models["smollm2-135m-instruct"]
        judge = models["Qwen/Qwen3-8B"]
        # The plan subsets the task's own GPUs: the searcher spans both, the judge shares one.
        assert searcher["env"]["CUDA_VISIBLE_DEVICES"].split(",") == allocated
        assert judge["env"]["CUDA_VISIBLE_DEVICES"] in allocated
        assert flag(searcher["argv"], "--tensor-parallel-size") == "2"
        assert flag(searcher["argv"], "--gpu-memory-utilization") == "0.45"
        assert flag(judge["argv"], "--max-model-len") == "8192"
        assert searcher["argv"][:1] == ["serve"] and judge["argv"][:1] == ["serve"]
        for server in started:
            # vLLM's compile cache on the node's own disk, not a shared home (item 4).
            assert server["env"]["VLLM_CACHE_ROOT"].startswith(str(tmp_path / "node-local")), task
    assert allocations[0].isdisjoint(allocations[1])  # each task its own GPUs


def _sinfo(fmt: str) -> str:
    return subprocess.run(["sinfo", "-h", "-o", fmt], capture_output=True, text=True).stdout


@pytest.mark.slurm
def test_shared_servers_serve_the_judge_once_for_every_task(tmp_path):
    """`--shared-servers judge`: one job serves the judge's model on its own GPU; the two array
    tasks wait for its endpoints file, each serving only the searcher on its own GPU; every key
    is recorded; once both tasks have ended the stop job cancels the servers job, whose servers
    stop and whose endpoints file goes."""
    cluster_up()
    stand_in_vllm(tmp_path / "bin")
    record_dir, run_dir = tmp_path / "servers", tmp_path / "shared run"
    env = {k: v for k, v in os.environ.items() if k != "CTS_VLLM_PYTHON"}
    env |= {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"}
    env |= {"CTS_VLLM_RECORD_DIR": str(record_dir), "TMPDIR": str(tmp_path / "node-local")}
    env |= {"PYTHONPATH": str(ROOT), "CTS_SCRIPTED_DELAY_S": "1"}
    (tmp_path / "node-local").mkdir()
    models = ["roles.searcher.model=smollm2-135m-instruct-vllm", "roles.judge.model=qwen3-8b"]
    extra = [a for item in [*models, "dataset.limit=2"] for a in ("--set", item)]
    result = subprocess.run(
        [sys.executable, "-m", "tests.scripted_cts", "slurm", "submit", "--shards", "2",
         "--gpus-per-task", "1", "--cpus-per-task", "1", "--mem", "2G", "--ready-timeout", "120",
         "--shared-servers", "judge", "--shared-gpus", "1",
         "--output-dir", str(run_dir), *overrides(tmp_path), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    servers_job, stop_job = re.findall(
        r"shared servers job (\d+) \(qwen3-8b\), cancelled by job (\d+)", result.stdout
    )[0]
    line = next(x for x in result.stdout.splitlines() if x.startswith("submitted evaluation job"))
    array_job, final_job = re.findall(r"job (\d+)", line)
    wait_for([array_job, final_job, stop_job, servers_job], 600)

    status = slurm_status(run_dir)
    logs = "".join(p.read_text() for p in (run_dir / "slurm" / "logs").glob("*.out"))
    assert [s["job"]["state"] for s in status["shards"]] == ["COMPLETED"] * 2, (status, logs)
    assert status["final"]["state"] == "COMPLETED", (status, logs)
    assert sum(s["records"] for s in status["shards"]) == 2 * 2  # blurred, clarify@1
    assert _state(stop_job) == "COMPLETED" and _state(servers_job) == "COMPLETED", logs
    assert status["servers_job"] == servers_job and status["servers"]["state"] == "COMPLETED"
    assert not (run_dir / "slurm" / "shared-endpoints.json").exists()
    assert "SIGTERM: all servers stopped" in logs

    started = recorded(record_dir)
    served = sorted(
        (flag(s["argv"], "--served-model-name"), s["env"]["SLURM_JOB_ID"]) for s in started
    )
    task_jobs = {s["env"]["SLURM_JOB_ID"] for s in started if "SLURM_ARRAY_TASK_ID" in s["env"]}
    assert len(task_jobs) == 2, served  # one searcher server in each task, the judge in neither
    assert served == sorted(
        [("Qwen/Qwen3-8B", servers_job)] + [("smollm2-135m-instruct", j) for j in task_jobs]
    )
    (judge,) = (s for s in started if flag(s["argv"], "--served-model-name") == "Qwen/Qwen3-8B")
    assert flag(judge["argv"], "--host") == "0.0.0.0"  # reachable from other nodes


def _state(job: str) -> str:
    """The job's state as scontrol has it (the test cluster keeps no accounting for sacct)."""
    states = job_states(job)
    return states[""].state if "" in states else "unknown"
