"""The plan of `cts serve` (cts/serving/server_group.py runs it): which served models get a
server, the GPUs each takes (its `vllm.gpus`, or packed from `tensor_parallel_size` and
`gpu_memory_utilization`), replicas, LoRA adapters on their base's server, ports, and each
server's command line; `--dry-run` prints it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from cts.serving.model_config import ModelConfig, model_label
from cts.serving.vllm_server import VllmServer, free_port


class PlanError(ValueError):
    """The models do not fit on the GPUs there are."""


#: The share of each GPU the plan hands out: the rest holds what sits outside vLLM's
#: gpu_memory_utilization (each process's CUDA context, CUDA graphs, NCCL buffers), so models
#: sharing a GPU cannot sum to all of it.
GPU_SHARE_CAP = 0.95
CAP_NOTE = (
    f"the plan hands out {GPU_SHARE_CAP:.0%} of each GPU: CUDA contexts and graphs sit outside "
    "vLLM's share"
)


def chat_template_problem(model: ModelConfig, path: str) -> str | None:
    """Why the served checkpoint at `path` cannot answer chat requests, or None: every role
    sends chat messages, and a checkpoint without a chat template makes vLLM refuse each one.
    Only a local checkpoint is checked (a hub id is checked where its weights are)."""
    if any(a.split("=")[0] == "--chat-template" for a in model.vllm.extra_args):
        return None
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        return None
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return None
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if isinstance(config, dict) and config.get("chat_template"):
        return None
    return (
        f"checkpoint {folder} ships no chat template (none in tokenizer_config.json, no "
        "chat_template.jinja): vLLM would refuse every chat request. Use the instruct/chat "
        'checkpoint, or give one: vllm.extra_args: ["--chat-template", "/path/template.jinja"]'
    )


@dataclass
class PlannedServer:
    #: The name roles use for the model (its config file name or inline key).
    key: str
    config: ModelConfig
    gpus: list[str]
    port: int
    server: VllmServer = field(repr=False)
    #: Which copy of the model (`vllm.replicas`), from 0.
    replica: int = 0

    @property
    def label(self) -> str:
        """The key, and which copy for the second and later: `judge`, `judge #2`."""
        return self.key if self.replica == 0 else f"{self.key} #{self.replica + 1}"

    def describe(self) -> dict[str, object]:
        return {
            "name": self.config.name,
            "base_url": self.server.base_url,
            "gpus": self.gpus,
            "log": str(self.server.log_path),
            "pid": self.server.process.pid if self.server.process else None,
        }


def served_models(models: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
    """The models `cts serve` starts: engine `openai` with `vllm.serve` on, and not a LoRA
    adapter served by another model's server (`lora_of`)."""
    return {
        k: m
        for k, m in models.items()
        if m.engine == "openai" and m.vllm.serve and m.lora_of is None
    }


#: LoRA ranks vLLM accepts for --max-lora-rank.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_args(base: str, models: dict[str, ModelConfig]) -> list[str]:
    """vLLM flags serving every adapter whose config names `base` in `lora_of`, each under its
    config's `name`; none without. The rank bound is the largest adapter's `r`, rounded up to
    a rank vLLM accepts."""
    adapters = {m.name: m.resolved_adapter() for m in models.values() if m.lora_of == base}
    if not adapters:
        return []
    ranks = []
    for path in adapters.values():
        config = json.loads((Path(str(path)) / "adapter_config.json").read_text())
        ranks.append(int(config.get("r", 8)))
    rank = next((r for r in LORA_RANKS if r >= max(ranks)), LORA_RANKS[-1])
    modules = [f"{name}={path}" for name, path in adapters.items()]
    return [
        "--enable-lora",
        "--max-loras",
        str(len(adapters)),
        "--max-lora-rank",
        str(rank),
        "--lora-modules",
        *modules,
    ]


def only_models(models: dict[str, ModelConfig], keys: str | None) -> dict[str, ModelConfig]:
    """The models named in `keys` (comma-separated) and the adapters served on them
    (`lora_of`), all without; PlanError for a name the experiment does not use."""
    if keys is None:
        return models
    wanted = [k.strip() for k in keys.split(",") if k.strip()]
    unknown = [k for k in wanted if k not in models]
    if unknown:
        raise PlanError(f"--models {keys}: {unknown} not among the experiment's {sorted(models)}")
    return {k: m for k, m in models.items() if k in wanted or m.lora_of in wanted}


def available_gpus() -> list[str]:
    """GPU ids this job may use: CUDA_VISIBLE_DEVICES (Slurm sets it to the allocation), else
    what `nvidia-smi` lists, else none."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def plan_gpus(models: dict[str, ModelConfig], gpus: list[str]) -> dict[str, list[str]]:
    """Model key → the GPUs it runs on. Explicit `vllm.gpus` are honoured first; the rest are
    packed largest first, each onto the `tensor_parallel_size` GPUs with the most free memory
    that can hold its fraction."""
    free = dict.fromkeys(gpus, GPU_SHARE_CAP)
    plan: dict[str, list[str]] = {}

    def take(key: str, chosen: list[str], fraction: float) -> None:
        for gpu in chosen:
            free[gpu] = round(free[gpu] - fraction, 6)
        plan[key] = chosen

    for key, model in models.items():
        args = model.vllm
        if args.gpus is None:
            continue
        chosen = [str(g) for g in args.gpus]
        unknown = [g for g in chosen if g not in free]
        if unknown:
            raise PlanError(
                f"model {key}: vllm.gpus {chosen} names GPU(s) {unknown} this job does not have "
                f"(available: {gpus or 'none'})"
            )
        if len(chosen) != args.tensor_parallel_size:
            raise PlanError(
                f"model {key}: vllm.gpus lists {len(chosen)} GPU(s) but tensor_parallel_size "
                f"is {args.tensor_parallel_size}"
            )
        short = [g for g in chosen if free[g] + 1e-9 < args.gpu_memory_utilization]
        if short:
            raise PlanError(
                f"model {key}: GPU(s) {short} have {[free[g] for g in short]} of their memory "
                f"left to plan, it needs {args.gpu_memory_utilization} ({CAP_NOTE})"
            )
        take(key, chosen, args.gpu_memory_utilization)

    rest = sorted(
        (k for k, m in models.items() if m.vllm.gpus is None),
        key=lambda k: (
            -models[k].vllm.tensor_parallel_size,
            -models[k].vllm.gpu_memory_utilization,
        ),
    )
    for key in rest:
        args = models[key].vllm
        fitting = sorted(
            (g for g in free if free[g] + 1e-9 >= args.gpu_memory_utilization),
            key=lambda g: (-free[g], gpus.index(g)),
        )
        if len(fitting) < args.tensor_parallel_size:
            raise PlanError(
                f"model {key} needs {args.tensor_parallel_size} GPU(s) with "
                f"{args.gpu_memory_utilization:.0%} of their memory free, but "
                + (
                    "only "
                    + ", ".join(f"GPU {g}: {free[g]:.0%} free" for g in free)
                    + " remain after "
                    + (", ".join(f"{k} on {v}" for k, v in plan.items()) or "nothing")
                    + f" ({CAP_NOTE})"
                    if free
                    else "this job has no GPU (set CUDA_VISIBLE_DEVICES, pass --gpus, or "
                    "--cpu for the CPU build)"
                )
            )
        take(
            key,
            sorted(fitting[: args.tensor_parallel_size], key=gpus.index),
            args.gpu_memory_utilization,
        )
    return plan


def _copies(models: dict[str, ModelConfig], counts: dict[str, int]) -> dict[str, ModelConfig]:
    """Every copy of every model as a plan entry of its own: `key`, `key #2`, …"""
    return {
        (key if r == 0 else f"{key} #{r + 1}"): model
        for key, model in models.items()
        for r in range(counts[key])
    }


def plan_replicas(models: dict[str, ModelConfig], gpus: list[str]) -> dict[str, list[list[str]]]:
    """Model key → the GPUs of each of its copies. Fixed counts are planned as `plan_gpus`
    plans models; then models with `replicas: auto` get one more copy each in turn while one
    fits beside everything planned."""
    counts = {k: 1 if m.vllm.replicas == "auto" else m.vllm.replicas for k, m in models.items()}
    plan = plan_gpus(_copies(models, counts), gpus)
    growing = [k for k, m in models.items() if m.vllm.replicas == "auto"]
    while growing:
        for key in list(growing):
            try:
                plan = plan_gpus(_copies(models, {**counts, key: counts[key] + 1}), gpus)
            except PlanError:
                growing.remove(key)
                continue
            counts[key] += 1
    copies = list(_copies(models, counts))
    return {k: [plan[c] for c in copies if c == k or c.startswith(f"{k} #")] for k in models}


def server_args(model: ModelConfig, cpu: bool) -> list[str]:
    """vLLM flags from the model config (the CPU build takes no GPU flags)."""
    args: list[str] = []
    if model.dtype != "auto":
        args += ["--dtype", model.dtype]
    if model.revision:
        args += ["--revision", model.revision]
    if not cpu:
        args += [
            "--tensor-parallel-size",
            str(model.vllm.tensor_parallel_size),
            "--gpu-memory-utilization",
            str(model.vllm.gpu_memory_utilization),
        ]
    if model.vllm.max_model_len:
        args += ["--max-model-len", str(model.vllm.max_model_len)]
    return [*args, *model.vllm.extra_args]


def plan_servers(
    models: dict[str, ModelConfig],
    log_dir: Path,
    gpus: list[str] | None = None,
    cpu: bool = False,
    python: str | None = None,
    host: str = "127.0.0.1",
) -> list[PlannedServer]:
    """Everything needed to start the servers, without starting any (`--dry-run` prints it).
    On the CPU build each model gets its `replicas` copies (`auto`: one)."""
    wanted = served_models(models)
    assignment: dict[str, list[list[str]]]
    if cpu:
        assignment = {
            k: [[]] * (1 if m.vllm.replicas == "auto" else m.vllm.replicas)
            for k, m in wanted.items()
        }
    else:
        assignment = plan_replicas(wanted, gpus or available_gpus())
    planned = []
    taken: set[int] = set()
    for key, model in wanted.items():
        path = model.resolved_path()
        problem = chat_template_problem(model, path)
        if problem is not None:
            raise PlanError(f"model {key}: {problem}")
        for replica, gpus_of in enumerate(assignment[key]):
            port = _port(key, model, replica, taken, host)
            env = dict(model.vllm.env)
            if not cpu:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus_of)
            label = model_label(key, model.name) + (f".{replica + 1}" if replica else "")
            server = VllmServer(
                model_path=path,
                served_name=model.name,
                log_path=log_dir / f"{label}.log",
                port=port,
                host=host,
                python=python,
                args=[*server_args(model, cpu), *lora_args(key, models)],
                env=env,
            )
            planned.append(PlannedServer(key, model, gpus_of, port, server, replica))
    return planned


def _port(key: str, model: ModelConfig, replica: int, taken: set[int], host: str) -> int:
    """A fixed `vllm.port` (the next ones for further copies), else a free one not yet given
    to another server of this plan."""
    if model.vllm.port is not None:
        port = model.vllm.port + replica
        if port in taken:
            raise PlanError(f"model {key}: port {port} is already used by another model")
    else:
        port = free_port(host)
        while port in taken:
            port = free_port(host)
    taken.add(port)
    return port


def dry_run_text(planned: list[PlannedServer]) -> str:
    lines = []
    for p in planned:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(p.server.env.items()))
        lines += [
            f"# {p.label} ({p.config.name}) on GPU(s) {','.join(p.gpus) or 'none (CPU)'}, "
            f"port {p.port}, log {p.server.log_path}",
            (env + " " if env else "") + shlex.join(p.server.command()),
        ]
    return "\n".join(lines)
