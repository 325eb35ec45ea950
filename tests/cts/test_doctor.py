"""`cts doctor`: each line OK or what to do, against the real Slurm test cluster, a network file
system (statfs type faked), missing weights, and a fake `nvidia-smi` on PATH."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import cts.foundation.filesystems
from cts.cli import app
from tests.slurm.test_slurm_cluster import cluster_up

#: The experiment of these tests: the tiny model for every role, the judge served by vLLM.
SERVED = ["--set", "roles.judge.model=smollm2-135m-instruct-vllm"]


def doctor(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, ["doctor", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output.splitlines()


def line(lines: list[str], start: str) -> str:
    found = [x for x in lines if x.startswith(start)]
    assert found, f"no line starting {start!r} in:\n" + "\n".join(lines)
    return found[0]


@pytest.mark.slurm
def test_slurm_version_test_only_and_partitions_from_the_cluster(tmp_path):
    cluster_up()
    args = ["--slurm", "--gpus-per-task", "2", "--cpus-per-task", "1", "--mem", "1G"]
    code, lines = doctor(*args, "--output-dir", str(tmp_path / "run"))
    assert re.match(r"OK   slurm: slurm(-wlm)? \d+\.\d+", line(lines, "OK   slurm:"))
    array = line(lines, "OK   sbatch --test-only eval array:")
    assert re.search(r"Job \d+ to start at .* in partition debug", array)
    assert "OK   sbatch --test-only eval final:" in "\n".join(lines)
    assert "GRES gpu:4" in line(lines, "OK   partition debug*:")
    assert code == 0, lines

    # Eight GPUs a task: the cluster's node has four. sbatch --test-only says so.
    code, lines = doctor(*args[:1], "--gpus-per-task", "8", "--cpus-per-task", "1", "--mem", "1G")
    refused = line(lines, "FIX  sbatch --test-only eval array:")
    assert "Requested node configuration is not available" in refused
    assert "change --partition, --gpus-per-task" in refused
    assert code == 1 and lines[-1] == "1 to fix"  # the merge, on no GPU, would start


def test_caches_on_a_network_file_system_are_reported(tmp_path, monkeypatch):
    home = tmp_path / "shared home"
    monkeypatch.setenv("CTS_HOME", str(home))
    nfs = str(home)
    monkeypatch.setattr(
        cts.foundation.filesystems,
        "statfs_type",
        lambda path: 0x6969 if str(path).startswith(nfs) else 0xEF53,  # NFS, else ext4
    )
    _, lines = doctor("--output-dir", str(tmp_path / "run"))
    shared = line(lines, "OK   $CTS_HOME:")
    assert "nfs, a network file system" in shared and "rollback journal" in shared
    assert "lockd" in shared
    assert line(lines, "OK   run directory:").endswith("local file system")
    assert "nfs" in line(lines, "OK   response cache:")


def test_missing_weights_say_to_download_them(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty hub cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    empty = tmp_path / "empty ckpt"
    empty.mkdir()
    present = tmp_path / "ckpt"
    present.mkdir()
    (present / "config.json").write_text("{}")
    (present / "model.safetensors").write_bytes(b"\0" * 4096)
    args = [
        *("--set", "roles.judge.model=qwen3-8b", "--set", "roles.searcher.model=qwen3-32b"),
        *("--set", f"models.qwen3-32b.path={empty}", "--set", "roles.clarifier.model=llama"),
        *("--set", "models.llama.name=l", "--set", f"models.llama.path={present}"),
    ]
    code, lines = doctor(*args, "--output-dir", str(tmp_path / "run"))
    hub = line(lines, "FIX  weights qwen3-8b:")
    assert "Qwen/Qwen3-8B: not found" in hub and "`cts models download -c quickstart`" in hub
    assert "has no config.json and weights" in line(lines, "FIX  weights qwen3-32b:")
    assert line(lines, "OK   weights llama:").endswith("(0.0 GB)")
    assert "for the 2 to download (qwen3-32b, qwen3-8b)" in line(lines, "OK   disk:")
    assert code == 1


FAKE_NVIDIA_SMI = """#!{python}
import sys
assert "--query-gpu=index,name,memory.total,memory.used" in sys.argv, sys.argv
used = {used}
for i in range(2):
    print(f"{{i}}, NVIDIA H100 80GB HBM3, 81559, {{used[i]}}")
"""


def fake_nvidia_smi(bin_dir: Path, used: list[int]) -> None:
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(FAKE_NVIDIA_SMI.format(python=sys.executable, used=used))
    script.chmod(0o755)


def test_gpu_memory_against_the_serve_plan_on_a_fake_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    # Two served models at 0.45 and 0.9 on two 80 GB GPUs: the plan fits when both are free.
    served = [*SERVED, "--set", "roles.searcher.model=qwen3-8b"]
    served += ["--set", "models.smollm2-135m-instruct-vllm.vllm.gpu_memory_utilization=0.9"]
    fake_nvidia_smi(tmp_path / "bin", used=[0, 0])
    _, lines = doctor(*served, "--output-dir", str(tmp_path / "run"))
    assert "smollm2-135m-instruct-vllm 0.9" in line(lines, "OK   gpu 0 (NVIDIA H100 80GB HBM3")
    assert "qwen3-8b 0.45" in line(lines, "OK   gpu 1 (NVIDIA H100 80GB HBM3")

    # Something holds half of GPU 0: vLLM would refuse to start at 0.9 there.
    fake_nvidia_smi(tmp_path / "bin", used=[40000, 0])
    code, lines = doctor(*served, "--output-dir", str(tmp_path / "run"))
    busy = line(lines, "FIX  gpu 0")
    assert "51% free (40000 MiB in use), the plan puts 0.9 on it" in busy
    assert code == 1

    # Weights larger than their share: 60 GiB (a sparse file) in 0.45 of 80 GB.
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text("{}")
    with (big / "model.safetensors").open("wb") as f:
        f.truncate(60 * 2**30)
    fake_nvidia_smi(tmp_path / "bin", used=[0, 0])
    _, lines = doctor(*served, "--set", f"models.qwen3-8b.path={big}")
    assert "qwen3-8b: 60 GiB of weights per GPU" in line(lines, "FIX  gpu 1")

    # Three models of 0.9 on two GPUs: the plan itself does not fit.
    more = [*served, "--set", "models.qwen3-8b.vllm.gpu_memory_utilization=0.9"]
    more += ["--set", "roles.summarizer.model=qwen3-32b"]
    _, lines = doctor(*more)
    assert "needs 1 GPU(s) with 90% of their memory free" in line(lines, "FIX  gpu plan:")


def test_no_nvidia_smi_says_where_to_run_the_gpu_check(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    _, lines = doctor(*SERVED, "--output-dir", str(tmp_path / "run"))
    assert "run `cts doctor` on a GPU node" in line(lines, "--   gpu:")
