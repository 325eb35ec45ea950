"""API keys come from the environment and must never reach a record, a trace or a log. Whatever
reads a key reads it here, and `redact` removes every key read so far from a text that may
quote it (a server's error body, an exception message) before that text is written anywhere.
A URL's credentials (`http://user:password@host/v1`, a gateway's basic auth) are secrets too:
`split_credentials` takes them out of the URL that messages quote and remembers the password
and the basic-auth token it becomes."""

from __future__ import annotations

import base64
import json
import os
import re
from urllib.parse import unquote

from cts.foundation.yaml_config import ConfigError

REDACTED = "[redacted]"
# Values this short would redact ordinary words; no real API key is this short.
_MIN_SECRET_CHARS = 8
_seen: set[str] = set()


def remember(secret: str) -> None:
    """Redact `secret` from every text `redact` sees from now on, in each form a message may
    quote it: as is, and escaped as repr and JSON write it (an exception quoting the header
    `b'Bearer KEY\\n'` holds the backslash, not the newline)."""
    if len(secret) < _MIN_SECRET_CHARS:
        return
    _seen.add(secret)
    for escaped in (
        repr(secret)[1:-1],
        json.dumps(secret)[1:-1],
        repr(secret.encode())[2:-1],
        secret.encode("unicode_escape").decode("ascii"),
    ):
        _seen.add(escaped)


def secret_from_env(name: str) -> str | None:
    """The value of environment variable `name` without surrounding whitespace, remembered (as
    read and as returned) as a secret to redact; None when unset or blank. Surrounding
    whitespace is stripped, not refused: a key read from a secret file (`KEY=$(<file)` keeps
    no newline, but `env_file`, Kubernetes and hand-made exports do) ends in a newline that no
    key holds, and a header cannot carry it. Whitespace or a control character inside the key
    is a ConfigError naming the variable, never its value."""
    value = os.environ.get(name)
    if value is None:
        return None
    remember(value)
    key = value.strip()
    if not key:
        return None
    remember(key)
    if any(c.isspace() or not c.isprintable() for c in key):
        raise ConfigError(
            f"environment variable {name}: the key in it holds whitespace or a control "
            "character (not a key an HTTP header can carry; its value is not shown)"
        )
    return key


#: The user:password@ part of a URL, with or without its scheme (a URL missing `http://` is
#: quoted in the error that refuses it, and must not quote its password either).
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)?(?P<userinfo>[^/?#@]*)@")


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """`url` without its user:password part, and that part (None without one), whose
    password is remembered as a secret: the URL quoted in messages then holds no credential,
    and the request carries them as basic auth."""
    found = _USERINFO.match(url)
    if found is None:
        return url, None
    userinfo = found["userinfo"]
    user, _, password = userinfo.partition(":")
    # Every form the credentials travel or may be quoted in: as written, decoded, and as the
    # basic-auth header's base64 token (a server that echoes the Authorization header).
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    for secret in (userinfo, password, unquote(password), token):
        remember(secret)
    return (found["scheme"] or "") + url[found.end() :], (unquote(user), unquote(password))


def without_credentials(url: str) -> str:
    """`url` as a message may quote it: without its user:password part."""
    return split_credentials(url)[0]


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
