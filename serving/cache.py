"""Response cache: SQLite in WAL mode, shared safely by the processes of one run (Slurm tasks).

Keyed by engine identity (engine kind, model, weights), messages, sampling (seed included) and
output spec, so a finished run re-runs without a single model call, and conditions that do not
depend on the clarifier (blurred, oracle) are reused across clarifier comparisons.
Only answers that passed validation are stored; errors are never cached. Requests without a
seed ask for fresh randomness and bypass the cache.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
import time
from pathlib import Path

from serving.engine import ChatModel, EngineStats
from serving.types import ChatRequest, ChatResponse

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    engine TEXT NOT NULL,
    response TEXT NOT NULL,
    created REAL NOT NULL
)
"""


def open_shared_sqlite(path: Path, schema: str) -> sqlite3.Connection:
    """A connection several processes (Slurm tasks) can write through at once: WAL, and
    autocommit so that each write is its own short transaction and concurrent writers wait
    (busy_timeout) instead of failing. Callers guard it with a lock across threads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA busy_timeout = 60000")
    # Switching a new file to WAL needs an exclusive lock, and SQLite does not wait on the busy
    # handler for it: two Slurm tasks opening a fresh cache at once got "database is locked".
    deadline = time.monotonic() + 60
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05 + random.random() * 0.2)
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute(schema)
    return db


class ResponseCache:
    """A key → ChatResponse store. One connection per process, guarded by a lock."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self._db = open_shared_sqlite(self.path, _SCHEMA)
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> ChatResponse | None:
        with self._lock:
            row = self._db.execute(
                "SELECT response FROM responses WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return ChatResponse.model_validate_json(row[0])

    def put(self, key: str, engine_identity: str, response: ChatResponse) -> None:
        blob = response.model_copy(update={"cached": False}).model_dump_json()
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO responses (key, engine, response, created) "
                "VALUES (?, ?, ?, ?)",
                (key, engine_identity, blob, time.time()),
            )

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses}

    def close(self) -> None:
        with self._lock:
            self._db.close()


class CachedEngine:
    """Wraps an engine (same `ChatModel` interface); identical concurrent requests share one
    model call."""

    def __init__(self, inner: ChatModel, cache: ResponseCache) -> None:
        self.inner = inner
        self.cache = cache
        self.identity = inner.identity
        self.model = inner.model
        self._in_flight: dict[str, asyncio.Future[ChatResponse]] = {}

    async def chat(self, request: ChatRequest) -> ChatResponse:
        if request.sampling.seed is None:
            return await self.inner.chat(request)
        key = request.key(self.identity)
        hit = self.cache.get(key)
        if hit is not None:
            return hit.model_copy(update={"cached": True})
        if key in self._in_flight:
            shared = await asyncio.shield(self._in_flight[key])
            return shared.model_copy(update={"cached": True})
        future: asyncio.Future[ChatResponse] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = future
        try:
            response = await self.inner.chat(request)
            self.cache.put(key, self.identity, response)
            future.set_result(response)
            return response
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # mark retrieved: waiters re-raise it, nobody else must
            raise
        finally:
            del self._in_flight[key]

    @property
    def stats(self) -> EngineStats:
        return self.inner.stats

    async def aclose(self) -> None:
        await self.inner.aclose()
