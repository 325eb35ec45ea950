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
