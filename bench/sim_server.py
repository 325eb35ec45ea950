"""A simulated OpenAI-compatible model server: scripted answers after a set latency.

It answers each role of the quickstart as cts/serving/scripted.py does, after request_s +
token_s × tokens seconds, for any number of requests at once, and counts the requests in flight
(/stats). The `curve` part of bench/pipeline.py runs the pipeline against it
(bench/orchestration_cost.py).

Apart from the measurements because it is a server, not a measurement: its HTTP handling, how
it tells the roles apart and its own process (`python bench/sim_server.py PORT`, which
`sim_server` starts) change with the protocol the engines speak, not with what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the repository's packages, when run as a script

from cts.serving.types import (  # noqa: E402 - after the path fix
    ChatRequest,
    ChoiceOutput,
    JsonSchemaOutput,
    RegexOutput,
)

#: The latency by default (bench/pipeline.py's --sim-request-s, --sim-token-s, --sim-tokens):
#: seconds per request, seconds per token, and the tokens of every answer.
REQUEST_S = 0.05
TOKEN_S = 0.004
TOKENS = 64


# -- how the simulated server answers --------------------------------------------------------------


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


# -- its HTTP endpoint and its process -------------------------------------------------------------


def chat_request_of(body: dict[str, Any]) -> ChatRequest:
    """The request an OpenAI-compatible body carries, its constraint (`structured_outputs`)
    included, as the scripted engines take it."""
    outputs = body.get("structured_outputs") or {}
    output: Any = None
    if "json" in outputs:
        output = JsonSchemaOutput(json_schema=outputs["json"])
    elif "regex" in outputs:
        output = RegexOutput(pattern=outputs["regex"])
    elif "choice" in outputs:
        output = ChoiceOutput(choices=tuple(outputs["choice"]))
    return ChatRequest.of(body["messages"], output=output)


def completion(body: dict[str, Any], text: str, tokens: int) -> dict[str, Any]:
    """The chat completion answering `body` with `text`, its usage a fixed `tokens` generated
    and a prompt of a token per 4 characters."""
    prompt = sum(len(m["content"]) for m in body["messages"]) // 4 + 1
    return {
        "choices": [{"message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": tokens},
    }


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
            text = scripts[sim_role(body)](chat_request_of(body))
            await asyncio.sleep(delay)
        finally:
            tick(-1)
        return JSONResponse(completion(body, text, tokens))

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
def sim_server(
    request_s: float, token_s: float, tokens: int
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The simulated server in a process of its own on a free loopback port, until it answers
    /health: its base URL and its process (whose CPU time the `curve` part reads)."""
    from cts.serving.vllm_server import free_port

    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            __file__,
            str(port),
            *("--request-s", str(request_s)),
            *("--token-s", str(token_s)),
            *("--tokens", str(tokens)),
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


def main(argv: Sequence[str] | None = None) -> None:
    """`python bench/sim_server.py PORT [--request-s S] [--token-s S] [--tokens N]`: serve until
    stopped."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--request-s", type=float, default=REQUEST_S)
    parser.add_argument("--token-s", type=float, default=TOKEN_S)
    parser.add_argument("--tokens", type=int, default=TOKENS)
    args = parser.parse_args(argv)
    serve_sim(args.port, args.request_s, args.token_s, args.tokens)


if __name__ == "__main__":
    main()
