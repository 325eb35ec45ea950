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

from cts.foundation.disk import write_whole
from cts.serving.model_config import ModelConfig, model_label
from cts.serving.openai_engine import endpoint_problem
from cts.serving.vllm_server import ServerError, VllmServer, free_port, log_tail


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
    #: Copies that died once all were ready while another copy of their model lives: label →
    #: exit code.
    lost: dict[str, int] = field(default_factory=dict)

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
            raise ServerError(f"model {p.label}: {e}") from None
        self.ready_s[p.label] = round(time.monotonic() - started_at, 1)
        self.check()

    def check(self) -> None:
        """Raise ServerError naming the first started server that has died, unless it is one
        copy of a model whose other copies live: the engine moves that copy's keys to them
        (cts/serving/replicas.py), and the copy is listed in `lost`."""
        dead = self._exited()
        gone = {p.label for p, _ in dead}
        for p, code in dead:
            alive = any(c.key == p.key and c.label not in gone for c in self.planned)
            if alive and len(self.ready_s) == len(self.planned):  # a start is all-or-nothing
                self.lost.setdefault(p.label, code)
                continue
            raise ServerError(
                f"model {p.label}: vLLM server ({p.config.name}, port {p.port}) exited with "
                f"code {code}; last lines of {p.server.log_path}:\n{log_tail(p.server.log_path)}"
            )

    def _exited(self) -> list[tuple[PlannedServer, int]]:
        """The started servers whose process has ended, with its exit code."""
        found = []
        for p in self.planned:
            code = p.server.process.poll() if p.server.process is not None else None
            if code is not None:
                found.append((p, code))
        return found

    def stop(self) -> None:
        for p in reversed(self.planned):
            p.server.stop()

    def endpoints(self) -> dict[str, object]:
        """Per model: its first server's description, with `base_urls` listing every copy's."""
        models: dict[str, dict[str, object]] = {}
        for p in self.planned:
            entry = models.setdefault(p.key, {**p.describe(), "base_urls": []})
            assert isinstance(entry["base_urls"], list)
            entry["base_urls"].append(p.server.base_url)
        return {"pid": os.getpid(), "models": models, "ready_s": self.ready_s}


def write_endpoints(path: Path, group: ServerGroup) -> None:
    write_whole(path, json.dumps(group.endpoints(), indent=1))


class EndpointsError(ValueError):
    """An endpoints file that is missing or was not written by `cts serve`."""


#: How often a task waiting for a shared server job's endpoints file looks for it.
ENDPOINTS_POLL_S = 2.0


#: An endpoints file names a few servers: anything larger is not one (and /dev/zero never ends).
MAX_ENDPOINTS_BYTES = 1 << 20


def _small_file(path: Path) -> str:
    """The text of an endpoints file: a regular file (a device or a FIFO is refused unread)
    of at most MAX_ENDPOINTS_BYTES."""
    if path.exists() and not path.is_file():
        raise ValueError("not a regular file")
    with path.open("rb") as f:
        raw = f.read(MAX_ENDPOINTS_BYTES + 1)
    if len(raw) > MAX_ENDPOINTS_BYTES:
        raise ValueError(f"larger than {MAX_ENDPOINTS_BYTES >> 20} MiB")
    return raw.decode("utf-8")


def read_endpoints(path: Path, wait_s: float = 0.0) -> dict[str, str | list[str]]:
    """Model key → base URL (a list, one per copy, for a model served with replicas) from an
    endpoints file written by `cts serve`; waiting up to `wait_s` seconds for the file to
    appear (a shared server job writes it once its servers are ready)."""
    deadline = time.monotonic() + wait_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(min(ENDPOINTS_POLL_S, max(0.0, deadline - time.monotonic())))
    try:
        data = json.loads(_small_file(path))
    except FileNotFoundError:
        waited = f" after waiting {wait_s:g} s (is the shared servers job running? see its log)"
        raise EndpointsError(
            f"{path}: endpoints file not found"
            + (waited if wait_s else " (is `cts serve` running?)")
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as e:
        raise EndpointsError(
            f"{path}: not an endpoints file written by `cts serve` ({e})"
        ) from None
    except RecursionError:  # json.loads recurses per level: a file nested ~1000 deep
        raise EndpointsError(
            f"{path}: not an endpoints file written by `cts serve` (JSON nested too deeply)"
        ) from None
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise EndpointsError(
            f"{path}: not an endpoints file written by `cts serve` (no `models` mapping of "
            "model key to its server)"
        )
    urls = {}
    for key, entry in models.items():
        try:
            urls[key] = _urls(entry)
        except ValueError as e:
            raise EndpointsError(f"{path}: not an endpoints file (model {key}: {e})") from None
    return urls


def _urls(entry: object) -> str | list[str]:
    """A model's base URL, or its copies' (ValueError saying what is wrong)."""
    if not isinstance(entry, dict):
        raise ValueError(
            f"{type(entry).__name__} where `cts serve` writes an object with `base_urls`"
        )
    urls = entry.get("base_urls") or [entry.get("base_url")]  # files from before replicas
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise ValueError("base_urls (or base_url) is not a list of URLs")
    for url in urls:
        problem = endpoint_problem(url)
        if problem is not None:
            raise ValueError(problem)
    return urls[0] if len(urls) == 1 else urls


def urls_of(planned: list[PlannedServer]) -> dict[str, str | list[str]]:
    """Model key → its server's base URL, or the list of its copies'."""
    urls: dict[str, list[str]] = {}
    for p in planned:
        urls.setdefault(p.key, []).append(p.server.base_url)
    return {k: u[0] if len(u) == 1 else u for k, u in urls.items()}


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
    #: Seconds to wait for the endpoints file to appear (a shared servers job writes it when
    #: its servers are ready); 0: it must exist already.
    endpoints_wait_s: float = 0.0

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
) -> Iterator[tuple[dict[str, str | list[str]], Callable[[], None] | None]]:
    """For the block, each served model's URL (from the endpoints file, and from servers started
    here for the others and stopped after), and a check that raises ServerError when one has
    died (None when nothing was started here). `on_start(n)` is told before n servers start."""
    urls = (
        read_endpoints(options.endpoints, options.endpoints_wait_s)
        if options.endpoints is not None
        else {}
    )
    if not options.serve:
        yield urls, None
        return
    # Models the endpoints file lists (a shared servers job's) are not served here again.
    planned = options.plan({k: m for k, m in models.items() if k not in urls}, log_dir)
    if planned:
        on_start(len(planned))
    # A signal while the servers load stops them; once the run starts, its own handlers take
    # over (finished records stay, the run is resumable).
    group = ServerGroup(planned, deadline_s=options.ready_timeout_s)
    with stop_on_signals(), serving(group) as group:
        yield {**urls, **urls_of(group.planned)}, group.check
