"""The openai engine against a dead port and a scripted local HTTP server (fault injection)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator

import pytest

from cts.foundation.yaml_config import ConfigError
from cts.serving.errors import (
    ConstrainedOutputError,
    EngineError,
    EngineUnavailable,
    ServerUnreachable,
)
from cts.serving.openai_engine import OpenAIEngine
from cts.serving.types import ChatRequest, ChoiceOutput, JsonSchemaOutput
from cts.serving.vllm_server import free_port
from tests.fault_helpers import QuietHandler, loopback_server


def completion(text: str) -> dict:
    return {
        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1},
    }


class Scripted:
    """Replies in order from `replies` (status, payload); the last one repeats. With `gather`
    set, each request waits until that many have been in flight at once (a point of progress,
    so a slow machine cannot miss the peak), then `delay_s` more."""

    def __init__(self, replies: list[tuple[int, dict]]) -> None:
        self.replies = replies
        self.bodies: list[dict] = []
        self.delay_s = 0.0
        self.gather: int | None = None
        self.active = 0
        self.peak = 0
        self.lock = threading.Condition()


@pytest.fixture
def server() -> Iterator[tuple[str, Scripted]]:
    script = Scripted([(200, completion("yes"))])

    class Handler(QuietHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with script.lock:
                script.bodies.append(body)
                script.active += 1
                script.peak = max(script.peak, script.active)
                script.lock.notify_all()
                if script.gather is not None:  # a hang guard, not a speed assumption
                    assert script.lock.wait_for(lambda: script.peak >= script.gather, 60)
            time.sleep(script.delay_s)
            with script.lock:
                script.active -= 1
            self.send_json(*script.replies[min(len(script.bodies), len(script.replies)) - 1])

    with loopback_server(Handler) as url:
        yield f"{url}/v1", script


YES_NO = ChatRequest.of([{"role": "user", "content": "?"}], ChoiceOutput(choices=("yes", "no")))


def test_dead_port_retries_then_names_the_endpoint():
    """Nobody listening through every retry is a dead server, not the request's failure:
    ServerUnreachable (which stops a run) rather than an EngineError (which a key records)."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    engine = OpenAIEngine("m", url, max_retries=3, backoff_s=0.01)
    with pytest.raises(ServerUnreachable) as e:
        asyncio.run(engine.chat(YES_NO))
    assert not isinstance(e.value, EngineError)
    assert f"{url}/chat/completions (model m): 4 attempts failed" in str(e.value)
    assert "ConnectError" in str(e.value)


def test_the_wait_between_attempts_doubles_up_to_its_cap(monkeypatch):
    """0.5 s, 1, 2, 4, 8, then 8 s each (each up to a quarter more, at random): a server back
    from a restart is tried again within seconds, however long it was away."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr("cts.serving.openai_engine.asyncio.sleep", sleep)
    url = f"http://127.0.0.1:{free_port()}/v1"
    engine = OpenAIEngine("m", url, max_retries=7, backoff_s=0.5)
    with pytest.raises(ServerUnreachable, match="8 attempts failed"):
        asyncio.run(engine.chat(YES_NO))
    floors = [0.5, 1, 2, 4, 8, 8, 8]
    assert len(waits) == len(floors)
    assert all(floor <= wait <= floor * 1.25 for wait, floor in zip(waits, floors, strict=True))


def test_5xx_and_429_are_retried_then_succeed(server):
    url, script = server
    script.replies = [
        (503, {"error": "loading"}),
        (429, {"error": "busy"}),
        (200, completion("no")),
    ]
    engine = OpenAIEngine("m", url, max_retries=3, backoff_s=0.01)
    response = asyncio.run(engine.chat(YES_NO))
    assert response.parsed == "no"
    assert len(script.bodies) == 3


def _requests_until_it_fails(
    server: tuple[str, Scripted],
    reply: tuple[int, dict],
    max_retries: int,
    error: type[Exception],
    match: str,
) -> int:
    """Every reply `reply`: the engine must raise `error`; how many requests did it send?"""
    url, script = server
    script.replies = [reply]
    engine = OpenAIEngine("m", url, max_retries=max_retries, backoff_s=0.01)
    with pytest.raises(error, match=match):
        asyncio.run(engine.chat(YES_NO))
    return len(script.bodies)


def test_persistent_5xx_gives_up_with_the_last_error(server):
    last = r"3 attempts failed; last error: HTTP 500"
    sent = _requests_until_it_fails(server, (500, {"error": "boom"}), 2, EngineUnavailable, last)
    assert sent == 3


def test_4xx_is_not_retried(server):
    refused = r"refused the request: HTTP 400.*bad schema"
    sent = _requests_until_it_fails(server, (400, {"error": "bad schema"}), 3, EngineError, refused)
    assert sent == 1


def test_unconstrained_answer_to_a_constrained_request_is_a_counted_error(server):
    # What a server that silently ignored the constraint would send back.
    url, script = server
    script.replies = [(200, completion("Well, it depends."))]
    engine = OpenAIEngine("m", url, max_retries=0)
    for _ in range(3):
        with pytest.raises(ConstrainedOutputError):
            asyncio.run(engine.chat(YES_NO))
    assert engine.stats.errors == {"constrained_output_invalid": 3}


def test_constraints_travel_as_structured_outputs_never_guided(server):
    url, script = server
    script.replies = [(200, completion('{"a": 1}'))]
    schema = JsonSchemaOutput(
        json_schema={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    )
    asyncio.run(
        OpenAIEngine("m", url).chat(ChatRequest.of([{"role": "user", "content": "?"}], schema))
    )
    asyncio.run(
        OpenAIEngine("m", url, constraint_field="response_format").chat(
            ChatRequest.of([{"role": "user", "content": "?"}], schema)
        )
    )
    plain, formatted = script.bodies
    assert plain["structured_outputs"] == {"json": schema.json_schema}
    assert formatted["response_format"]["type"] == "json_schema"
    assert formatted["response_format"]["json_schema"]["schema"] == schema.json_schema
    for body in script.bodies:
        assert not [k for k in body if k.startswith("guided")]


def test_api_key_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("CTS_TEST_KEY", raising=False)
    # A config problem (exit 2, no traceback), not a model call's failure.
    with pytest.raises(ConfigError, match="api_key_env names CTS_TEST_KEY, which is not set"):
        OpenAIEngine("m", "http://127.0.0.1:9/v1", api_key_env="CTS_TEST_KEY")
    monkeypatch.setenv("CTS_TEST_KEY", "sk-secret")
    engine = OpenAIEngine("m", "http://127.0.0.1:9/v1", api_key_env="CTS_TEST_KEY")
    assert "sk-secret" not in engine.identity


def test_concurrency_is_bounded(server):
    url, script = server
    script.gather, script.delay_s = 2, 0.1
    engine = OpenAIEngine("m", url, max_concurrency=2)

    async def go() -> None:
        await asyncio.gather(*(engine.chat(YES_NO) for _ in range(6)))

    asyncio.run(go())
    assert len(script.bodies) == 6
    assert script.peak == 2


@pytest.mark.parametrize("status", [400, 503])
def test_a_server_echoing_the_api_key_never_puts_it_in_an_error(server, monkeypatch, status):
    """Error bodies are copied into records and dialogues: a configured key is redacted from
    them first (and from anything `failure` records)."""
    from cts.eval.run.dialogue import failure

    key = "sk-live-0123456789abcdef"
    monkeypatch.setenv("CTS_TEST_KEY", key)
    url, script = server
    script.replies = [(status, {"error": f"invalid header Authorization: Bearer {key}"})]
    engine = OpenAIEngine("m", url, max_retries=1, backoff_s=0.01, api_key_env="CTS_TEST_KEY")
    with pytest.raises(EngineError) as e:
        asyncio.run(engine.chat(YES_NO))
    assert key not in str(e.value) and "Bearer [redacted]" in str(e.value)
    # Whatever else quotes the key (an exception a stage records) is redacted too.
    recorded = failure(EngineError(f"wrapped: {key}"), "judge")
    assert key not in recorded["message"] and "[redacted]" in recorded["message"]


@pytest.mark.parametrize(
    ("status", "cut"), [(503, 300), (400, 500), (200, 300)], ids=["retried", "refused", "malformed"]
)
def test_a_key_straddling_any_cut_of_an_error_body_is_redacted_whole(
    server, monkeypatch, status, cut
):
    """Error bodies are cut short (300 or 500 characters); a key that starts anywhere before
    the cut leaves not one of its characters in the error, where cutting before redacting kept
    all of it but its tail."""
    key = "KEY-7wq9-0123456789abcdef"
    monkeypatch.setenv("CTS_TEST_KEY", key)
    url, script = server
    engine = OpenAIEngine("m", url, max_retries=0, backoff_s=0.01, api_key_env="CTS_TEST_KEY")
    for start in range(cut - len(key) - 1, cut + 1):
        # The reply's body: `{"error": "` (11 characters), then padding up to the key.
        script.bodies.clear()
        script.replies = [(status, {"error": "x" * (start - 11) + key + "y" * 40})]
        with pytest.raises(EngineError) as e:
            asyncio.run(engine.chat(YES_NO))
        message = str(e.value)
        assert "K" not in message, (start, message[-60:])
        if start + len(key) <= cut:
            assert "[redacted]" in message, start


def test_requests_sent_again_are_counted_by_why_and_the_run_warns_of_timeouts(server):
    """A retried attempt is no failure, but a timed-out one is server work thrown away: a run
    tuning its concurrency must see how many there were and why."""
    from cts.cli.common import retry_warnings

    url, script = server
    script.replies = [(503, {"error": "loading"}), (200, completion("no"))]
    engine = OpenAIEngine("m", url, max_retries=3, backoff_s=0.01)
    asyncio.run(engine.chat(YES_NO))
    assert engine.stats.retried == {"HTTP 503": 1}
    assert engine.stats.as_dict()["retried"] == {"HTTP 503": 1}

    script.replies = [(200, completion("no"))]
    script.delay_s = 0.5
    slow = OpenAIEngine("slow", url, timeout_s=0.2, max_retries=1, backoff_s=0.01)
    with pytest.raises(EngineUnavailable, match="2 attempts failed; last error: ReadTimeout"):
        asyncio.run(slow.chat(YES_NO))
    assert slow.stats.retried == {"timeout": 1}

    lines = retry_warnings({"m": engine.stats, "slow": slow.stats})
    assert lines[0] == "m: 1 attempts sent again over 1 requests (HTTP 503 1)"
    assert lines[1].startswith("slow: 1 attempts sent again over 1 requests (timeout 1); the")
    assert "raise the model's `timeout_s`" in lines[1]
    assert retry_warnings({"m": OpenAIEngine("m", url).stats}) == []


def test_requests_past_one_client_s_pool_spread_over_several_clients(server, monkeypatch):
    """One HTTP client's pool is kept small (httpcore scans it per request); an engine allowed
    more requests in flight opens more clients, so all of them are in flight at once."""
    import cts.serving.openai_engine

    monkeypatch.setattr(cts.serving.openai_engine, "CLIENT_CONNECTIONS", 2)
    url, script = server
    script.replies = [(200, completion("yes"))]
    script.gather, script.delay_s = 5, 0.3
    engine = OpenAIEngine("m", url, max_concurrency=5, max_retries=0)

    async def burst() -> None:
        answers = await asyncio.gather(*(engine.chat(YES_NO) for _ in range(7)))
        assert [a.parsed for a in answers] == ["yes"] * 7
        assert len(engine._clients) == 3  # ceil(5 / 2), each with a pool of ceil(5 / 3) = 2
        await engine.aclose()

    asyncio.run(burst())
    assert script.peak == 5  # the engine's bound, not one pool's 2
