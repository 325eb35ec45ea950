"""Every tool call and its result, in SQLite: replayable runs and identical search results.

Keyed by the tool, the backend and the normalised arguments. With `offline=True` nothing is
executed: a call missing from the cache is an error naming the call, so a replay can never
quietly hit the network.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path
from typing import Any

from serving.cache import guard_cache_file, open_shared_sqlite

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

    def get(self, tool: str, backend: str, arguments: dict[str, Any]) -> Any | None:
        key, normalized = tool_key(tool, backend, arguments)
        with self._lock, guard_cache_file(self.path):
            row = self._db.execute("SELECT result FROM tool_calls WHERE key = ?", (key,)).fetchone()
        if row is not None:
            self.hits += 1
            return json.loads(row[0])
        self.misses += 1
        if self.offline:
            raise ToolCacheMiss(
                f"tools are offline and the tool cache {self.path} has no {tool} call to "
                f"backend {backend!r} with arguments {normalized}"
            )
        return None

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
