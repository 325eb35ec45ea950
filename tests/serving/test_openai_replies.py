"""What an OpenAI-compatible server answers that is not a chat completion (a 200 with a proxy's
page, a body cut off, JSON of another shape), and base URLs that are not URLs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import ClassVar

import pytest

from cts.foundation.yaml_config import ConfigError
from cts.serving.errors import EngineError, EngineUnavailable
from cts.serving.model_config import ModelConfig, build_engine, check_api_keys, load_model_config
from cts.serving.openai_engine import OpenAIEngine, endpoint_problem
from cts.serving.types import ChatRequest
from tests.fault_helpers import QuietHandler, loopback_server

ASK = ChatRequest.of([{"role": "user", "content": "?"}])
GOOD = json.dumps(
    {
        "choices": [{"message": {"content": "yes"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
).encode()


class Replies(QuietHandler):
    """Answers the bodies of `replies` in order (the last repeats), each a 200 of raw bytes."""

    replies: ClassVar[list[bytes]] = []
    count = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        cls = type(self)
        body = cls.replies[min(cls.count, len(cls.replies) - 1)]
        cls.count += 1
        kind = "text/html" if body.startswith(b"<") else "application/json"
        self.send_body(200, body, {"Content-Type": kind})


@pytest.fixture
def replies():
    Replies.replies, Replies.count = [GOOD], 0
    with loopback_server(Replies) as url:
        yield f"{url}/v1"


@pytest.mark.parametrize(
    "body", [GOOD[:25], b"<html><body>502 upstream error</body></html>", b"\xff\xfe{"]
)
def test_a_200_whose_body_is_not_json_is_sent_again_like_a_5xx(replies, body):
    """A proxy's error page or a body cut off is a passing fault: sent again (and counted),
    then, if it lasts, an engine_unavailable error naming the endpoint and the model; it was
    an uncaught JSONDecodeError (an `internal` failure naming neither, a traceback)."""
    Replies.replies = [body, GOOD]
    engine = OpenAIEngine("judge-model", replies, max_retries=2, backoff_s=0.001)
    assert asyncio.run(engine.chat(ASK)).text == "yes"
    assert engine.stats.retried == {"malformed reply": 1}

    Replies.replies, Replies.count = [body], 0
    with pytest.raises(EngineUnavailable) as e:
        asyncio.run(engine.chat(ASK))
    message = str(e.value)
    assert message.startswith(f"{replies}/chat/completions (model judge-model): 3 attempts")
    assert "HTTP 200 with a body that is not valid JSON" in message
    assert Replies.count == 3


@pytest.mark.parametrize(
    "payload",
    [
        {"choices": [{"message": {"content": 42}, "finish_reason": "stop"}]},
        {"choices": [{"message": {"content": "hi"}}], "usage": [1]},
        {"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": "x"}},
        {"choices": ["hi"]},
        {"choices": []},
        [1, 2],
    ],
    ids=["content-int", "usage-list", "usage-text", "choice-text", "no-choice", "a-list"],
)
def test_json_of_another_shape_is_one_engine_error_naming_endpoint_and_model(replies, payload):
    """The server's steady answer, not a passing fault: refused at once (one request), as an
    EngineError the key records, never an AttributeError or a ValidationError."""
    Replies.replies = [json.dumps(payload).encode()]
    engine = OpenAIEngine("judge-model", replies, max_retries=3, backoff_s=0.001)
    with pytest.raises(EngineError) as e:
        asyncio.run(engine.chat(ASK))
    assert type(e.value) is EngineError
    assert str(e.value).startswith(
        f"{replies}/chat/completions (model judge-model): malformed reply"
    )
    assert Replies.count == 1


def test_a_usage_count_left_null_counts_as_not_given(replies):
    Replies.replies = [
        json.dumps(
            {
                "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": None, "completion_tokens": 2},
            }
        ).encode()
    ]
    response = asyncio.run(OpenAIEngine("m", replies).chat(ASK))
    assert (response.text, response.usage.prompt_tokens, response.usage.completion_tokens) == (
        "hi",
        0,
        2,
    )


@pytest.mark.parametrize(
    "url",
    ["127.0.0.1:8000/v1", "localhost:8000", "ftp://h/v1", "http:///v1", "http://h:99999/v1"],
)
def test_a_base_url_that_is_not_an_absolute_http_url_is_refused(url):
    """Every request to it failed as a transport error, retried until each key failed."""
    assert endpoint_problem(url) is not None
    with pytest.raises(ConfigError, match="model m: endpoint"):
        OpenAIEngine("m", url)
    for fine in ("http://127.0.0.1:8000/v1", "https://gw.example/v1", "http://[::1]:8000/v1"):
        assert endpoint_problem(fine) is None


def test_a_model_config_s_endpoint_is_checked_at_its_line(tmp_path: Path):
    config = tmp_path / "judge.yaml"
    config.write_text("name: j\npath: x\nengine: openai\nendpoint: 127.0.0.1:8000/v1\n")
    with pytest.raises(ConfigError, match=rf"^{config}:4: endpoint: .*not an absolute http"):
        load_model_config(config)
    config.write_text("name: j\npath: x\nengine: openai\nendpoint: [http://a/v1, 'b:1']\n")
    with pytest.raises(ConfigError, match=rf"^{config}:4: endpoint: .*\[1\]: 'b:1' is not"):
        load_model_config(config)


def test_cts_openai_base_url_is_checked_naming_the_variable_not_its_password(monkeypatch):
    monkeypatch.setenv("CTS_OPENAI_BASE_URL", "user:pw-SECRET-0123@127.0.0.1:8000/v1")
    with pytest.raises(ConfigError, match="model m: CTS_OPENAI_BASE_URL: ") as e:
        build_engine(ModelConfig(name="m", path="x", engine="openai"))
    assert "pw-SECRET" not in str(e.value)


def test_an_unset_api_key_variable_is_a_config_error_naming_the_model_and_field(monkeypatch):
    monkeypatch.delenv("CTS_UNSET_KEY", raising=False)
    config = ModelConfig(
        name="oj-judge",
        path="x",
        engine="openai",
        endpoint="http://127.0.0.1:9/v1",
        api_key_env="CTS_UNSET_KEY",
    )
    with pytest.raises(ConfigError, match=r"^model oj: api_key_env names CTS_UNSET_KEY, which"):
        check_api_keys({"oj": config})
    with pytest.raises(ConfigError, match="model oj-judge: api_key_env names CTS_UNSET_KEY"):
        build_engine(config)
    monkeypatch.setenv("CTS_UNSET_KEY", "sk-live-set-0123456789")
    check_api_keys({"oj": config})
