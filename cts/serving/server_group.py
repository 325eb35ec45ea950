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
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from cts.foundation.disk import write_whole
from cts.serving.model_config import ModelConfig
from cts.serving.openai_engine import endpoint_problem
from cts.serving.server_plan import (
    PlannedServer,
    plan_servers,
)
from cts.serving.vllm_server import ServerError, log_tail


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
