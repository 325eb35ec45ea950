"""The pipeline's recorded request mix measured without the pipeline: replayed on the server
as its ceiling (the `ceiling` part of bench/pipeline.py: generated tokens/s at full load), sent
with and without its output constraints on the server and in process (`structured`), and its
prompts' shared prefixes counted (`prefix`).

Apart from the runs: these parts read only the recorded calls (bench/pipeline_recording.py), so
they change with what is asked of the mix, not with how the pipeline runs.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import statistics
import time
from collections import Counter, defaultdict
from typing import Any

import httpx

from bench.pipeline_recording import Call
from bench.server_metrics import (
    ServerMetrics,
    deltas,
    hit_rate,
    in_flight,
    rate_between,
    reset_prefix_cache,
)

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
