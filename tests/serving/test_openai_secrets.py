"""Keys and URL credentials of an OpenAI-compatible server: read from the environment, sent,
and never quoted in an error, a record or a log, in any escaped form."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import ClassVar

import pytest

from cts.foundation.secrets import redact, remember, secret_from_env, without_credentials
from cts.foundation.yaml_config import ConfigError
from cts.serving.errors import EngineError, EngineUnavailable, ServerUnreachable
from cts.serving.model_config import ModelConfig, build_engine
from cts.serving.openai_engine import OpenAIEngine
from cts.serving.types import ChatRequest
from cts.serving.vllm_server import free_port
from tests.fault_helpers import QuietHandler, loopback_server

ASK = ChatRequest.of([{"role": "user", "content": "?"}])


def answer(text: str) -> dict:
    return {"choices": [{"message": {"content": text}, "finish_reason": "stop"}]}


class Recording(QuietHandler):
    """Records each request's Authorization header; answers `reply` (status, payload)."""

    headers_seen: ClassVar[list[str | None]] = []
    reply: tuple[int, object] = (200, answer("yes"))

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).headers_seen.append(self.headers.get("Authorization"))
        self.send_json(*type(self).reply)


@pytest.fixture
def recording():
    Recording.headers_seen = []
    Recording.reply = (200, answer("yes"))
    with loopback_server(Recording) as url:
        yield url


@pytest.mark.parametrize(
    "secret", ["sk-live-\u00e9t\u00e9-0123456789", 'gw-pass"quote\\slash-99', "sk-tab\tkey-0123"]
)
def test_every_escaped_form_of_a_secret_is_redacted(secret):
    """An exception quotes a header as bytes (`b'Bearer …\\n'`), a body quotes JSON: the
    secret in those forms holds backslashes, not its own characters, and was kept whole."""
    remember(secret)
    for form in (secret, repr(secret), json.dumps(secret), repr(secret.encode()), ascii(secret)):
        text = redact(f"Illegal header value {form} sent")
        assert "0123" not in text and "-99" not in text, (form, text)
        assert "[redacted]" in text


def test_a_key_ending_in_a_newline_is_sent_without_it_and_never_recorded(recording, monkeypatch):
    """A key from a secret file ends in a newline: httpx refused the header and its error
    (`Illegal header value b'Bearer KEY\\n'`) went into the record unredacted. The newline,
    which no key holds, is stripped; the escaped form is redacted all the same."""
    raw = "sk-live-SECRET0123456789\n"
    monkeypatch.setenv("CTS_TEST_NL_KEY", raw)
    engine = OpenAIEngine("m", f"{recording}/v1", api_key_env="CTS_TEST_NL_KEY", max_retries=0)
    assert asyncio.run(engine.chat(ASK)).text == "yes"
    assert Recording.headers_seen == ["Bearer sk-live-SECRET0123456789"]
    quoted = f"LocalProtocolError: Illegal header value {('Bearer ' + raw).encode()!r}"
    assert "SECRET0123456789" not in redact(quoted)


def test_a_key_with_whitespace_inside_is_refused_naming_the_variable_not_the_key(monkeypatch):
    monkeypatch.setenv("CTS_TEST_BAD_KEY", "sk-live-0123\n456789")
    with pytest.raises(ConfigError, match="environment variable CTS_TEST_BAD_KEY") as e:
        secret_from_env("CTS_TEST_BAD_KEY")
    assert "0123" not in str(e.value)
    with pytest.raises(ConfigError, match="CTS_TEST_BAD_KEY"):
        OpenAIEngine("m", "http://127.0.0.1:9/v1", api_key_env="CTS_TEST_BAD_KEY")


def test_credentials_in_a_base_url_go_as_basic_auth_and_into_no_message(recording):
    """A gateway's basic auth in the URL: sent as an Authorization header; the URL that errors,
    stats and records quote holds neither the user nor the password, and a server echoing
    the password has it redacted."""
    password = "gw-SECRETpass99"
    url = recording.replace("http://", f"http://user:{password}@") + "/v1"
    engine = OpenAIEngine("m", url, max_retries=0)
    assert asyncio.run(engine.chat(ASK)).text == "yes"
    expected = base64.b64encode(f"user:{password}".encode()).decode()
    assert Recording.headers_seen == [f"Basic {expected}"]
    assert engine.replicas.urls == [f"{recording}/v1"]

    Recording.reply = (503, {"error": f"upstream refused {password}"})
    with pytest.raises(EngineUnavailable) as e:
        asyncio.run(engine.chat(ASK))
    assert password not in str(e.value) and "user:" not in str(e.value)
    assert f"{recording}/v1/chat/completions (model m)" in str(e.value)
    assert without_credentials(url) == f"{recording}/v1"
    # A server that echoes the Authorization header: the base64 token is redacted too.
    Recording.reply = (503, {"error": f"bad header Authorization: Basic {expected}"})
    with pytest.raises(EngineUnavailable) as e:
        asyncio.run(engine.chat(ASK))
    assert expected not in str(e.value) and "Basic [redacted]" in str(e.value)


def test_credentials_of_cts_openai_base_url_stay_out_of_server_unreachable(monkeypatch):
    password = "gw-SECRETpass77"
    port = free_port()
    monkeypatch.setenv("CTS_OPENAI_BASE_URL", f"http://user:{password}@127.0.0.1:{port}/v1")
    config = ModelConfig(name="m", path="x", engine="openai", max_retries=0)
    engine = build_engine(config)
    with pytest.raises(ServerUnreachable) as e:
        asyncio.run(engine.chat(ASK))
    assert password not in str(e.value) and "user:" not in str(e.value)
    assert f"http://127.0.0.1:{port}/v1/chat/completions" in str(e.value)


def test_a_malformed_reply_quoting_the_key_is_redacted(recording, monkeypatch):
    key = "sk-live-echoed-0123456789"
    monkeypatch.setenv("CTS_TEST_KEY", key)
    Recording.reply = (200, {"error": f"Bearer {key}"})
    engine = OpenAIEngine("m", f"{recording}/v1", api_key_env="CTS_TEST_KEY", max_retries=0)
    with pytest.raises(EngineError, match="malformed reply") as e:
        asyncio.run(engine.chat(ASK))
    assert key not in str(e.value)


def test_a_transport_error_quoting_the_key_is_redacted(monkeypatch):
    """httpx's protocol errors quote the header they refused; whatever a transport error says
    reaches the record only redacted."""
    import httpx

    key = "sk-live-transport-0123456789"
    monkeypatch.setenv("CTS_TEST_KEY", key)
    engine = OpenAIEngine("m", "http://127.0.0.1:9/v1", api_key_env="CTS_TEST_KEY", max_retries=0)

    async def refuse(*args: object, **kwargs: object) -> None:
        raise httpx.RemoteProtocolError(f"Illegal header value b'Bearer {key}'")

    monkeypatch.setattr(engine, "_post", refuse)
    with pytest.raises(EngineUnavailable) as e:
        asyncio.run(engine.chat(ASK))
    assert key not in str(e.value) and "Bearer [redacted]" in str(e.value)
