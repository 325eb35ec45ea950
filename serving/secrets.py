"""API keys come from the environment and must never reach a record, a trace or a log. Whatever
reads a key reads it here, and `redact` removes every key read so far from a text that may
quote it (a server's error body, an exception message) before that text is written anywhere."""

from __future__ import annotations

import os

REDACTED = "[redacted]"
# Values this short would redact ordinary words; no real API key is this short.
_MIN_SECRET_CHARS = 8
_seen: set[str] = set()


def secret_from_env(name: str) -> str | None:
    """The value of environment variable `name`, remembered as a secret to redact."""
    value = os.environ.get(name)
    if value and len(value) >= _MIN_SECRET_CHARS:
        _seen.add(value)
    return value or None


def redact(text: str) -> str:
    # Longest first: a key that contains another is removed whole.
    for secret in sorted(_seen, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def redact_cut(text: str, limit: int) -> str:
    """`text` redacted, then cut to `limit` characters. Never cut first: a key crossing the cut
    would no longer match, and all of it but its tail would be kept. Only the part a key
    starting before the cut can reach is searched, so a long body costs no more than that."""
    reach = limit + max((len(s) for s in _seen), default=0)
    return redact(text[:reach])[:limit]
