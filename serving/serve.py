"""`cts serve`: one vLLM server per distinct served model of an experiment.

The plan: every role's model whose engine is `openai` and whose config says `vllm.serve: true`
gets a server. GPUs come from the model's `vllm.gpus`, or are packed automatically from its
declared `tensor_parallel_size` (GPUs it spans) and `gpu_memory_utilization` (the fraction of
each of those GPUs it takes); models sharing a GPU start one after another, because vLLM sizes
its KV cache from the memory free when it starts. The group is all-or-nothing: when any server
dies, or on SIGINT/SIGTERM, every started server is stopped and the error names the model with
the tail of its log. Once all are ready, an endpoints file maps each model to its URL; `cts run
--endpoints FILE` reads it.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from serving.disk import write_whole
from serving.model_config import ModelConfig, model_label
from serving.vllm_server import ServerError, VllmServer, free_port, log_tail


class Stopped(Exception):
    """SIGINT or SIGTERM arrived while servers were starting or serving."""


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Stopped` inside the block (so starting servers are stopped by
    the normal cleanup, not abandoned); the previous handlers come back after it."""

    def raise_stopped(signum: int, frame: FrameType | None) -> None:
        raise Stopped(signal.Signals(signum).name)

    previous = {s: signal.signal(s, raise_stopped) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


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

    def describe(self) -> dict[str, object]:
        return {
            "name": self.config.name,
            "base_url": self.server.base_url,
            "gpus": self.gpus,
            "log": str(self.server.log_path),
            "pid": self.server.process.pid if self.server.process else None,
        }


def served_models(models: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
    """The models `cts serve` starts: engine `openai` with `vllm.serve` on."""
    return {k: m for k, m in models.items() if m.engine == "openai" and m.vllm.serve}


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
    """Everything needed to start the servers, without starting any (`--dry-run` prints it)."""
    wanted = served_models(models)
    assignment = {k: [] for k in wanted} if cpu else plan_gpus(wanted, gpus or available_gpus())
    planned = []
    taken: set[int] = set()
    for key, model in wanted.items():
        port = model.vllm.port or free_port(host)
        if port in taken:
            raise PlanError(f"model {key}: port {port} is already used by another model")
        taken.add(port)
        env = dict(model.vllm.env)
        if not cpu:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(assignment[key])
        path = model.resolved_path()
        problem = chat_template_problem(model, path)
        if problem is not None:
            raise PlanError(f"model {key}: {problem}")
        server = VllmServer(
            model_path=path,
            served_name=model.name,
            log_path=log_dir / f"{model_label(key, model.name)}.log",
            port=port,
            host=host,
            python=python,
            args=server_args(model, cpu),
            env=env,
        )
        planned.append(PlannedServer(key, model, assignment[key], port, server))
    return planned


def dry_run_text(planned: list[PlannedServer]) -> str:
    lines = []
    for p in planned:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(p.server.env.items()))
        lines += [
            f"# {p.key} ({p.config.name}) on GPU(s) {','.join(p.gpus) or 'none (CPU)'}, "
            f"port {p.port}, log {p.server.log_path}",
            (env + " " if env else "") + shlex.join(p.server.command()),
        ]
    return "\n".join(lines)


def _shares_gpu(a: PlannedServer, b: PlannedServer) -> bool:
    return bool(set(a.gpus) & set(b.gpus))


#: Seconds all servers of a group may take to become ready, unless --ready-timeout says.
DEFAULT_READY_TIMEOUT_S = 1800.0


@dataclass
class ServerGroup:
    """Start, watch and stop the planned servers as one."""

    planned: list[PlannedServer]
    deadline_s: float = DEFAULT_READY_TIMEOUT_S
    ready_s: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        """Start every server and wait until all are ready; on any failure stop them all."""
        started_at = time.monotonic()
        try:
            waiting: list[PlannedServer] = []
            for p in self.planned:
                # vLLM sizes its KV cache from the memory free at start: a server that shares
                # a GPU waits until the earlier ones on it have loaded.
                for earlier in [w for w in waiting if _shares_gpu(w, p)]:
                    self._wait(earlier, started_at)
                    waiting.remove(earlier)
                p.server.start()
                waiting.append(p)
            for p in waiting:
                self._wait(p, started_at)
        except BaseException:
            self.stop()
            raise

    def _wait(self, p: PlannedServer, started_at: float) -> None:
        left = self.deadline_s - (time.monotonic() - started_at)
        try:
            p.server.wait_ready(deadline_s=max(left, 1.0))
        except ServerError as e:
            raise ServerError(f"model {p.key}: {e}") from None
        self.ready_s[p.key] = round(time.monotonic() - started_at, 1)
        self.check()

    def check(self) -> None:
        """Raise ServerError naming the first started server that has died."""
        for p in self.planned:
            process = p.server.process
            if process is not None and process.poll() is not None:
                raise ServerError(
                    f"model {p.key}: vLLM server ({p.config.name}, port {p.port}) exited with "
                    f"code {process.returncode}; last lines of {p.server.log_path}:\n"
                    f"{log_tail(p.server.log_path)}"
                )

    def stop(self) -> None:
        for p in reversed(self.planned):
            p.server.stop()

    def endpoints(self) -> dict[str, object]:
        return {
            "pid": os.getpid(),
            "models": {p.key: p.describe() for p in self.planned},
            "ready_s": self.ready_s,
        }


def write_endpoints(path: Path, group: ServerGroup) -> None:
    write_whole(path, json.dumps(group.endpoints(), indent=1))


class EndpointsError(ValueError):
    """An endpoints file that is missing or was not written by `cts serve`."""


def read_endpoints(path: Path) -> dict[str, str]:
    """Model key → base URL from an endpoints file written by `cts serve`."""
    try:
        data = json.loads(path.read_text())
        return {key: entry["base_url"] for key, entry in data["models"].items()}
    except FileNotFoundError:
        raise EndpointsError(
            f"{path}: endpoints file not found (is `cts serve` running?)"
        ) from None
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise EndpointsError(
            f"{path}: not an endpoints file written by `cts serve` ({e})"
        ) from None


@contextmanager
def serving(group: ServerGroup, endpoints_file: Path | None = None) -> Iterator[ServerGroup]:
    """Servers up for the duration of the block; the endpoints file exists only while they are."""
    group.start()
    try:
        if endpoints_file is not None:
            write_endpoints(endpoints_file, group)
        yield group
    finally:
        if endpoints_file is not None:
            endpoints_file.unlink(missing_ok=True)
        group.stop()


@dataclass(frozen=True)
class ServeOptions:
    """How a run reaches the models whose engine is `openai`."""

    #: An endpoints file written by a running `cts serve`.
    endpoints: Path | None = None
    #: Start the servers for the run and stop them after it (what Slurm tasks do).
    serve: bool = False
    #: GPU ids to plan on, e.g. "0,1" (None: CUDA_VISIBLE_DEVICES, else nvidia-smi).
    gpus: str | None = None
    #: The CPU build of vLLM: no GPU plan, no GPU flags.
    cpu: bool = False
    #: The vLLM venv's interpreter (default $CTS_VLLM_PYTHON, else `vllm serve`).
    vllm_python: str | None = None
    #: Seconds all servers together may take to become ready (a first start may compile).
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S

    def plan(
        self, models: dict[str, ModelConfig], log_dir: Path, host: str = "127.0.0.1"
    ) -> list[PlannedServer]:
        return plan_servers(
            models,
            log_dir,
            gpus=[g.strip() for g in self.gpus.split(",") if g.strip()] if self.gpus else None,
            cpu=self.cpu,
            python=self.vllm_python or os.environ.get("CTS_VLLM_PYTHON") or None,
            host=host,
        )


@contextmanager
def served(
    models: dict[str, ModelConfig],
    options: ServeOptions,
    log_dir: Path,
    on_start: Callable[[int], None] = lambda n: None,
) -> Iterator[tuple[dict[str, str], Callable[[], None] | None]]:
    """For the block, each served model's URL (from the endpoints file, or from servers started
    here and stopped after), and a check that raises ServerError when one has died (None when
    nothing was started here). `on_start(n)` is told before n servers start."""
    urls = read_endpoints(options.endpoints) if options.endpoints is not None else {}
    if not options.serve:
        yield urls, None
        return
    planned = options.plan(models, log_dir)
    if planned:
        on_start(len(planned))
    # A signal while the servers load stops them; once the run starts, its own handlers take
    # over (finished records stay, the run is resumable).
    group = ServerGroup(planned, deadline_s=options.ready_timeout_s)
    with stop_on_signals(), serving(group) as group:
        yield {**urls, **{p.key: p.server.base_url for p in group.planned}}, group.check
