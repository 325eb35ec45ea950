"""What the pipeline itself costs, with no real model behind it: seconds of orchestration per
model call on zero-latency scripted engines, with a profile's top entries (the `overhead` part
of bench/pipeline.py), and the calls/s it reaches against the simulated server
(bench/sim_server.py) at each concurrency, beside the ideal (`curve`).

Apart from the server runs: these parts need no vLLM server and measure cts's own code, so they
change with the orchestration, not with the model server.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any
from unittest import mock

import httpx

import cts.eval.experiment
from bench.pipeline_figures import curve_row
from bench.pipeline_recording import scripted
from bench.pipeline_runs import outcome_of, overrides, run_quietly, scripted_experiment
from bench.sim_server import sim_server
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.serving.openai_engine import CLIENT_CONNECTIONS

# -- part: orchestration overhead ------------------------------------------------------------------


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_curve(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The pipeline's calls/s at each concurrency against the ideal: `concurrency` requests
    always in flight, each taking the simulated latency. Four times as many keys as slots (at
    least 10), so that the ramp-down is a small part of the run."""
    latency = args.sim_request_s + args.sim_token_s * args.sim_tokens
    rows = []
    with sim_server(args.sim_request_s, args.sim_token_s, args.sim_tokens) as (base, process):
        for concurrency in args.curve:
            tag = f"curve-{concurrency}"
            resolved = curve_experiment(f"{base}/v1", work, tag, concurrency)
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


def curve_experiment(endpoint: str, work: Path, tag: str, concurrency: int) -> ResolvedExperiment:
    """The quickstart on the simulated server at `endpoint`, without the response cache, with
    four times as many keys as slots (at least 10): as many seeds of the sample dev split as
    that takes, and of each seed as many instances."""
    keys = max(10, 4 * concurrency)
    per_seed = 24 * 5  # the sample dev split's instances × the quickstart's conditions
    seeds = math.ceil(keys / per_seed)
    instances = min(24, math.ceil(keys / (5 * seeds)))
    settings = {
        "name": "sim",
        "engine": "openai",
        "endpoint": endpoint,
        "max_concurrency": 4096,
        # Sampled, so that each seed's dialogues and visits are their own requests.
        "sampling": {"temperature": 0.7},
        "max_retries": 0,
    }
    return load_experiment(
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
