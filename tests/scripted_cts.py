"""`python -m tests.scripted_cts ARGS…`: the real `cts` command line, with every role on a
scripted engine (cts/serving/scripted.py) behind the real response cache. For subprocess tests of
whole runs (a full disk, shards sharing files, a preempted Slurm task) that finish in seconds.

$CTS_SCRIPTED_DELAY_S (default 0) delays each model call by up to that many seconds, drawn
from $CTS_SCRIPTED_TIMING (a seed): the answers never depend on it, only the interleaving of
concurrent keys and processes does."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import cts.eval.construct.blur as blur_module
import cts.eval.construct.fuse as fuse_module
import cts.eval.experiment as experiment_module
import cts.slurm.render as render_module
from cts.cli import app
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import Role
from cts.eval.run.engines import Engines
from cts.serving.cache import CachedEngine, ResponseCache
from cts.serving.engine import ChatModel
from cts.serving.scripted import ScriptedEngine, scripted_roles
from cts.serving.types import ChatRequest, ChatResponse

ROOT = Path(__file__).resolve().parent.parent


def start(args: list[str], home: Path, **env: str) -> subprocess.Popen[str]:
    """`cts ARGS` on scripted engines in a subprocess, with $CTS_HOME `home`."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.scripted_cts", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "CTS_HOME": str(home), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def cts(args: list[str], home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`cts ARGS` run to its end: exit code, stdout, stderr."""
    process = start(args, home, **env)
    out, err = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


class JitteredEngine(ScriptedEngine):
    """A scripted engine whose every call takes a random while."""

    def __init__(self, inner: ScriptedEngine, most_s: float, rng: random.Random) -> None:
        super().__init__(inner.script, inner.model)
        self.most_s = most_s
        self.rng = rng

    async def _complete(self, request: ChatRequest) -> ChatResponse:
        self.delay_s = self.rng.uniform(0, self.most_s)
        return await super()._complete(request)


@asynccontextmanager
async def scripted_engines(
    resolved: ResolvedExperiment, roles: list[Role] | None = None, use_cache: bool = True
) -> AsyncIterator[Engines]:
    """What cts.eval.run.engines.open_engines gives, with scripted engines in place of the
    models."""
    config = resolved.experiment.cache
    cache = ResponseCache(config.resolved_path()) if use_cache and config.enabled else None
    most_s = float(os.environ.get("CTS_SCRIPTED_DELAY_S", "0"))
    rng = random.Random(os.environ.get("CTS_SCRIPTED_TIMING", "0"))
    scripted = scripted_roles()
    by_role: dict[Role, ChatModel] = {}
    try:
        for role in roles or list(resolved.experiment.roles):
            engine = JitteredEngine(scripted[role], most_s, rng) if most_s else scripted[role]
            by_role[role] = CachedEngine(engine, cache) if cache is not None else engine
        yield Engines({str(role): e for role, e in by_role.items()}, by_role, cache)
    finally:
        if cache is not None:
            cache.close()


if __name__ == "__main__":
    for module in (experiment_module, fuse_module, blur_module):
        module.open_engines = scripted_engines  # type: ignore[attr-defined]
    # Slurm jobs submitted from here run this wrapper too, so their roles are scripted as well.
    render_module.cts_command = lambda: [sys.executable, "-m", "tests.scripted_cts"]
    app(prog_name="cts")
