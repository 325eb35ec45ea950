"""Errors every engine raises, so callers can count failures by kind instead of by message."""

from __future__ import annotations


class EngineError(RuntimeError):
    """A model call failed. `kind` is a short stable label for failure tallies."""

    kind = "engine_error"


class EngineUnavailable(EngineError):
    """The endpoint could not be reached or kept failing after all retries."""

    kind = "engine_unavailable"


class ServerUnreachable(Exception):
    """Every attempt failed to connect: the server is down, not this request at fault. Not an
    EngineError on purpose: no key may record it as its failure (resume would then skip the
    key, and a dialogue would keep it); it stops the run, whose finished records stay."""


class ConstrainedOutputError(EngineError):
    """A constrained answer that does not satisfy its output spec: an error, never a value."""

    kind = "constrained_output_invalid"

    def __init__(self, message: str, text: str) -> None:
        super().__init__(f"{message}; raw answer: {text[:200]!r}")
        self.text = text


class ContextLengthExceeded(EngineError):
    """The server refused a request whose prompt plus `max_tokens` exceeds the model's context
    window (GPU vLLM 0.11-0.13 answer HTTP 400; later versions clamp `max_tokens` and refuse only
    a prompt that alone overflows). `window` and `prompt_tokens` are the server's figures when
    its message gives them; `exact` is false when the prompt's figure is only a lower bound."""

    kind = "context_length"

    def __init__(
        self, message: str, window: int | None, prompt_tokens: int | None, exact: bool = True
    ) -> None:
        super().__init__(message)
        self.window = window
        self.prompt_tokens = prompt_tokens
        self.exact = exact
