"""Every tool call and its result, in SQLite: replayable runs and identical search results.

Keyed by the tool, the backend and the normalised arguments. With `offline=True` nothing is
executed: a call missing from the cache is an error naming the call, so a replay can never
quietly hit the network. A row that does not parse as a result (edited, cut short, written by
another version) is a miss, counted as `invalid`, and removed: the call runs again.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from cts.serving.cache import guard_cache_file, open_shared_sqlite

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tool_calls (
    key TEXT PRIMARY KEY,
    tool TEXT NOT NULL,
    backend TEXT NOT NULL,
    arguments TEXT NOT NULL,
    result TEXT NOT NULL,
    created REAL NOT NULL
)
"""


T = TypeVar("T")


class ToolCacheMiss(LookupError):
    """Offline replay asked for a call that was never recorded."""


def tool_key(tool: str, backend: str, arguments: dict[str, Any]) -> tuple[str, str]:
    normalized = json.dumps(arguments, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.sha256(f"{tool}\x00{backend}\x00{normalized}".encode()).hexdigest()
    return digest, normalized


class ToolCache:
    def __init__(self, path: str | Path, offline: bool = False) -> None:
        self.path = Path(path).expanduser()
        self.offline = offline
        self._db = open_shared_sqlite(self.path, _SCHEMA)
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.invalid = 0

    def get(
        self,
        tool: str,
        backend: str,
        arguments: dict[str, Any],
        parse: Callable[[str], T] = json.loads,
    ) -> T | None:
        """The stored result as `parse` reads the row, or None (a miss). A row `parse` refuses
        (ValueError, pydantic's ValidationError among them) is removed and counted as a miss
        and as `invalid`, so that the call runs again and its fresh result is stored."""
        key, normalized = tool_key(tool, backend, arguments)
        with self._lock, guard_cache_file(self.path):
            row = self._db.execute("SELECT result FROM tool_calls WHERE key = ?", (key,)).fetchone()
        found = None if row is None else self._parsed(key, row[0], parse)
        if found is not None:
            self.hits += 1
            return found
        self.misses += 1
        if self.offline:
            why = "" if row is None else " (its row was not a result, and was removed)"
            raise ToolCacheMiss(
                f"tools are offline and the tool cache {self.path} has no {tool} call to "
                f"backend {backend!r} with arguments {normalized}{why}"
            )
        return None

    def _parsed(self, key: str, raw: str, parse: Callable[[str], T]) -> T | None:
        try:
            return parse(raw)
        except (ValueError, TypeError, RecursionError):
            self.invalid += 1
            with self._lock, guard_cache_file(self.path):
                # Only this exact row: another process may already have replaced it.
                self._db.execute("DELETE FROM tool_calls WHERE key = ? AND result = ?", (key, raw))
            return None

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "invalid": self.invalid}

    def put(self, tool: str, backend: str, arguments: dict[str, Any], result: Any) -> None:
        key, normalized = tool_key(tool, backend, arguments)
        with self._lock, guard_cache_file(self.path):
            self._db.execute(
                "INSERT OR IGNORE INTO tool_calls VALUES (?, ?, ?, ?, ?, ?)",
                (
                    key,
                    tool,
                    backend,
                    normalized,
                    json.dumps(result, ensure_ascii=False),
                    time.time(),
                ),
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()
