"""A vLLM server's /metrics as the benches read them: parsed (summed over label sets), sampled
every 0.5 s in a thread while a measurement runs, and the figures made of them (counter deltas,
requests running and waiting, the prefix-cache hit rate, generated tokens/s between two moments);
and the prefix cache reset before a measurement.

Apart from the measurements because every bench that drives a vLLM server reads it this way
(bench/pipeline.py's parts, bench/gpu_check.py, bench/replicas.py): it changes when vLLM's
metrics do, not when a measurement does.
"""

from __future__ import annotations

import bisect
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx

#: Seconds between two reads of /metrics while sampling.
SAMPLE_PERIOD_S = 0.5


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


def reset_prefix_cache(url: str) -> None:
    base = url.rstrip("/").removesuffix("/v1")
    httpx.post(f"{base}/reset_prefix_cache", timeout=60).raise_for_status()


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
