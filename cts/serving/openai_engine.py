"""Any OpenAI-compatible chat server, vLLM first.

Constraints travel as vLLM's `structured_outputs` (json / choice / regex) or, for JSON, as
`response_format` json_schema. Never as `guided_json`, `guided_choice`, …: vLLM >= 0.12 ignores
those silently and answers 200 with unconstrained text. The base class validates every
constrained answer anyway.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

from cts.foundation.secrets import redact, redact_cut, secret_from_env, split_credentials
from cts.foundation.yaml_config import ConfigError
from cts.serving.batching import settings_digest
from cts.serving.engine import Engine
from cts.serving.errors import (
    ContextLengthExceeded,
    EngineError,
    EngineUnavailable,
    ServerUnreachable,
)
from cts.serving.replicas import Replicas, Routing
from cts.serving.types import (
    ChatRequest,
    ChatResponse,
    ChoiceOutput,
    JsonSchemaOutput,
    OutputSpec,
    PromptCount,
    RegexOutput,
    Usage,
)

ConstraintField = Literal["structured_outputs", "response_format"]
_RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
#: Connections per HTTP client. httpcore's pool scans its connections for each request it
#: places, so one client past ~100 requests in flight spends more CPU than the requests take
#: (bench/RESULTS.md, 256 in flight on a simulated server: 41 calls/s on one client with
#: httpx's pool of 100, 427 on a client per 64); an engine allowed more in flight spreads them
#: over several clients.
CLIENT_CONNECTIONS = 64


#: vLLM's context-length refusal: "This model's maximum context length is W tokens. However,
#: you requested N tokens (P in the messages, C in the completion)…" (0.11-0.13), or "…your
#: prompt contains [at least] P input tokens…" (later versions, which clamp max_tokens).
_CONTEXT_WINDOW = re.compile(r"maximum context length is (\d+) tokens")
_PROMPT_TOKENS = re.compile(r"\((\d+) in the messages|contains (at least )?(\d+) input tokens")


def context_length_error(status: int, text: str) -> ContextLengthExceeded | None:
    """The refusal as a ContextLengthExceeded when a 400 says the context window overflowed."""
    if status != 400:
        return None
    try:
        body = json.loads(text)
        error = body.get("error", body) if isinstance(body, dict) else {}
        message = str(error.get("message", "")) if isinstance(error, dict) else ""
    except ValueError:
        message = text
    window = _CONTEXT_WINDOW.search(message)
    if window is None:
        return None
    prompt = _PROMPT_TOKENS.search(message)
    if prompt is None:
        return ContextLengthExceeded(message[:500], int(window[1]), None)
    tokens = int(prompt[1] or prompt[3])
    # "at least": the server stopped tokenizing one past its window.
    return ContextLengthExceeded(message[:500], int(window[1]), tokens, exact=not prompt[2])


def endpoint_problem(url: str) -> str | None:
    """Why `url` cannot be a server's base URL, or None: it must be an absolute http(s) URL
    with a host (`http://127.0.0.1:8000/v1`). Without the scheme every request would fail as a
    transport error, retried until each key fails, instead of the config being refused. The
    URL is quoted without its credentials."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number in range raises ValueError)
    except ValueError as e:
        return f"not a URL ({e})"
    public = split_credentials(url)[0]
    if any(c.isspace() or not c.isprintable() for c in url):
        return f"{public!r} holds whitespace or a control character"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{public!r} is not an absolute http(s) URL (e.g. http://127.0.0.1:8000/v1)"
    return None


def constraint_fields(spec: OutputSpec, prefer: ConstraintField) -> dict[str, Any]:
    """The request-body fields that carry `spec`."""
    if isinstance(spec, JsonSchemaOutput):
        if prefer == "response_format":
            return {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": spec.name, "schema": spec.json_schema, "strict": True},
                }
            }
        return {"structured_outputs": {"json": spec.json_schema}}
    if isinstance(spec, ChoiceOutput):
        return {"structured_outputs": {"choice": list(spec.choices)}}
    if isinstance(spec, RegexOutput):
        return {"structured_outputs": {"regex": spec.pattern}}
    raise TypeError(f"unknown output spec {spec!r}")


def served_identity(
    model: str,
    revision: str | None,
    chat_template_kwargs: Mapping[str, Any],
    served_as: Mapping[str, Any],
) -> str:
    """The engine's name in the response cache: the served model, and a digest of what else
    changes its answers (the chat template's options, what the server was started with). The
    endpoint is not in it: the same model on another port or node answers the same."""
    name = f"openai:{model}@{revision or 'served'}"
    settings = {"chat_template_kwargs": dict(chat_template_kwargs), **served_as}
    if not any(settings.values()):
        return name  # nothing said beyond the name: the identity caches had before
    return f"{name}+{settings_digest(settings)}"


class OpenAIEngine(Engine):
    #: The longest wait between two attempts: the doubling stops here, so that a server back
    #: after a restart (a minute or more) is found within seconds, not after a doubled wait.
    MAX_BACKOFF_S = 8.0

    def __init__(
        self,
        model: str,
        base_url: str | Sequence[str],
        *,
        api_key_env: str | None = None,
        max_concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        constraint_field: ConstraintField = "structured_outputs",
        chat_template_kwargs: dict[str, Any] | None = None,
        revision: str | None = None,
        routing: Routing = "affinity",
        served_as: Mapping[str, Any] | None = None,
    ) -> None:
        """`served_as`: what the server was started with that changes its answers (checkpoint,
        dtype, adapter, vLLM flags; `model_config.served_settings`), part of the identity."""
        super().__init__()
        self.model = model
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        for url in urls:
            problem = endpoint_problem(url)
            if problem is not None:
                raise ConfigError(f"model {model}: endpoint {problem}")
        # Credentials in a URL travel as basic auth; the URLs that stats and messages quote
        # hold none (cts/foundation/secrets.py).
        public, credentials = zip(*(split_credentials(u) for u in urls), strict=True)
        self._auth = [httpx.BasicAuth(*c) if c else None for c in credentials]
        #: One URL, or a model's replicas: each key's requests stay on one
        #: (cts/serving/replicas.py).
        self.replicas = Replicas(public, routing)
        if len(self.replicas) > 1:
            self.stats.replicas = self.replicas
        self.base_url = self.replicas.urls[0]
        self.url = f"{self.base_url}/chat/completions"
        self.chat_template_kwargs = chat_template_kwargs or {}
        self.identity = served_identity(model, revision, self.chat_template_kwargs, served_as or {})
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.constraint_field = constraint_field
        headers = {}
        if api_key_env:
            key = secret_from_env(api_key_env)
            if not key:
                raise ConfigError(
                    f"model {model}: api_key_env names {api_key_env}, which is not set (export "
                    "it, or leave api_key_env out for a server that takes no key)"
                )
            headers["Authorization"] = f"Bearer {key}"
        self._timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        self._headers = headers
        #: ceil(max_concurrency / CLIENT_CONNECTIONS) clients, and requests in flight on each.
        self._clients: list[httpx.AsyncClient] = []
        self._in_flight: list[int] = []
        self._max_concurrency = max_concurrency
        self._semaphore: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The last request body sent, for tests that check what went over the wire.
        self.last_body: dict[str, Any] | None = None

    def body(self, request: ChatRequest) -> dict[str, Any]:
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [m.model_dump() for m in request.messages],
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_tokens,
        }
        if s.seed is not None:
            body["seed"] = s.seed
        if s.stop:
            body["stop"] = list(s.stop)
        if s.repetition_penalty != 1.0:
            body["repetition_penalty"] = s.repetition_penalty  # vLLM extension
        if s.top_k is not None:
            body["top_k"] = s.top_k  # vLLM extension
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        if request.output is not None:
            body.update(constraint_fields(request.output, self.constraint_field))
        return body

    def _session(self) -> tuple[list[httpx.AsyncClient], asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if not self._clients or self._semaphore is None or self._loop is not loop:
            # Clients and semaphores are bound to one event loop.
            self._loop = loop
            n = max(1, math.ceil(self._max_concurrency / CLIENT_CONNECTIONS))
            per_client = math.ceil(self._max_concurrency / n)
            limits = httpx.Limits(max_connections=per_client, max_keepalive_connections=per_client)
            self._clients = [
                httpx.AsyncClient(timeout=self._timeout, headers=self._headers, limits=limits)
                for _ in range(n)
            ]
            self._in_flight = [0] * n
            self._semaphore = asyncio.Semaphore(self._max_concurrency)
        return self._clients, self._semaphore

    async def _post(
        self, clients: list[httpx.AsyncClient], replica: int, body: dict[str, Any]
    ) -> httpx.Response:
        """To `replica`, on the client with the fewest requests in flight: with the semaphore's
        bound, none holds more than its pool, so no request queues inside httpcore."""
        i = min(range(len(clients)), key=self._in_flight.__getitem__)
        self._in_flight[i] += 1
        self.replicas.in_flight[replica] += 1
        self.replicas.sent[replica] += 1
        try:
            return await clients[i].post(
                self._chat_url(replica), json=body, auth=self._auth_of(replica)
            )
        finally:
            self._in_flight[i] -= 1
            self.replicas.in_flight[replica] -= 1

    def _auth_of(self, replica: int) -> httpx.Auth | httpx._client.UseClientDefault:
        """The `auth` argument of a request to `replica`: the credentials its URL held."""
        return self._auth[replica] or httpx.USE_CLIENT_DEFAULT

    def _chat_url(self, replica: int) -> str:
        return f"{self.replicas.urls[replica]}/chat/completions"

    async def _complete(self, request: ChatRequest) -> ChatResponse:
        body = self.body(request)
        self.last_body = body
        clients, semaphore = self._session()
        last_error, why, url = "no attempt made", "", self.url
        refused = False
        attempt = 0
        while True:
            replica = self.replicas.pick()
            url = self._chat_url(replica)
            started = time.perf_counter()
            try:
                async with semaphore:
                    reply = await self._post(clients, replica, body)
            except (httpx.TransportError, httpx.TimeoutException) as e:
                # A protocol error may quote the request's headers (the key in them).
                last_error = redact(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
                # Nobody listening (or answering a connect): the server, not this request.
                refused = isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
                if refused and self.replicas.mark_down(replica):
                    # Another replica is live: this key moves there now, no wait, no attempt
                    # spent (a dead replica never comes back within a retry's backoff).
                    self.stats.retried["replica down"] += 1
                    continue
                busy = isinstance(e, httpx.TimeoutException) and not refused
                why = "timeout" if busy else "connection"
            else:
                refused = False
                self.replicas.mark_up(replica)
                settled = self._settle(reply, url, time.perf_counter() - started)
                if isinstance(settled, ChatResponse):
                    return settled
                why, last_error = settled
            attempt += 1
            if attempt > self.max_retries:
                break
            self.stats.retried[why] += 1
            delay = min(self.backoff_s * 2 ** (attempt - 1), self.MAX_BACKOFF_S)
            await asyncio.sleep(delay * (1 + random.random() / 4))
        message = (
            f"{url} (model {self.model}): {self.max_retries + 1} attempts failed; "
            f"last error: {last_error}"
        )
        raise ServerUnreachable(message) if refused else EngineUnavailable(message)

    def _settle(
        self, reply: httpx.Response, url: str, latency: float
    ) -> ChatResponse | tuple[str, str]:
        """The response, or the refusal raised, or (why, error) for a reply worth sending
        again: a 429 or 5xx, and a 200 whose body is not JSON. That one is a proxy's error page
        or a body cut off mid-way, both passing faults like a 502; a JSON body of the wrong
        shape is the server's steady answer, refused at once (`_response`)."""
        status = reply.status_code
        if status in _RETRYABLE_STATUS:
            # A server may echo the request's headers in its error body.
            return f"HTTP {status}", f"HTTP {status}: {redact_cut(reply.text, 300)}"
        overflow = context_length_error(status, reply.text)
        if overflow is not None:
            raise overflow
        if status != 200:
            raise EngineError(
                f"{url} (model {self.model}) refused the request: "
                f"HTTP {status}: {redact_cut(reply.text, 500)}"
            )
        try:
            payload = reply.json()
        except ValueError:  # not JSON, or not UTF-8
            return "malformed reply", (
                f"HTTP 200 with a body that is not valid JSON: {redact_cut(reply.text, 300)}"
            )
        return self._response(payload, url, latency)

    async def count_prompt_tokens(self, request: ChatRequest) -> PromptCount | None:
        """vLLM's `POST /tokenize` of the request's messages, with the chat template and the
        generation prompt as a chat request gets them; None when the server cannot say (not
        vLLM, unreachable): the caller then estimates."""
        replica = self.replicas.pick()
        root = self.replicas.urls[replica].removesuffix("/v1")
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [m.model_dump() for m in request.messages],
            "add_generation_prompt": True,
        }
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        clients, semaphore = self._session()
        try:
            async with semaphore:
                reply = await clients[0].post(
                    f"{root}/tokenize", json=body, auth=self._auth_of(replica)
                )
            payload = reply.json() if reply.status_code == 200 else {}
            return PromptCount(tokens=payload["count"], window=payload.get("max_model_len"))
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def _response(self, payload: Any, url: str, latency: float) -> ChatResponse:
        """The chat completion in `payload`; one of another shape (no choices, a content or
        usage of the wrong type) is an EngineError naming the endpoint and the model."""
        try:
            choice = payload["choices"][0]
            finish = choice.get("finish_reason") or "stop"
            usage = payload.get("usage") or {}
            return ChatResponse(
                text=choice["message"]["content"] or "",
                finish_reason="length" if finish == "length" else "stop",
                usage=Usage(
                    # A count left null is one not given, as a count left out is.
                    prompt_tokens=usage.get("prompt_tokens") or 0,
                    completion_tokens=usage.get("completion_tokens") or 0,
                ),
                latency_s=latency,
            )
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
            # ValueError covers pydantic's ValidationError (a content that is not text).
            raise EngineError(
                f"{url} (model {self.model}): malformed reply (not a chat completion): "
                f"{redact_cut(str(payload), 300)}"
            ) from e

    async def aclose(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            await client.aclose()
