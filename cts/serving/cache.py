"""Response cache: SQLite, shared safely by the processes of one run (Slurm tasks): in WAL mode
on a local file system; on a network one (NFS, Lustre, GPFS…), where SQLite's WAL does not work
across hosts, with a rollback journal and the file locks it takes (POSIX locks, which the
network file system must honour: NFS with lockd or v4, Lustre mounted with `flock`, GPFS).

Keyed by purpose (evaluation or golden construction), engine identity (engine kind, model,
weights), messages, sampling (seed included) and output spec, so a finished run re-runs without
a single model call, conditions that do not depend on the clarifier (blurred, oracle) are
reused across clarifier comparisons, and golden construction's answers never answer an
evaluation (a greedy oracle sends the very requests golden construction sent).
Only answers that passed validation are stored; errors are never cached. Requests without a
seed ask for fresh randomness and bypass the cache.

A stored answer is not trusted blindly: on every hit it is parsed again and, for a constrained
request, re-validated against the request's output spec (its `parsed` value is recomputed from
its text). A row that fails is a miss, counted as `invalid`: it is deleted and the model is
asked again. A valid-but-wrong row (well-formed JSON edited to other values) cannot be told
apart this way. A file that is not a readable SQLite database is a `CacheFileError`; a full
disk is `StorageFull`, and the cache stays consistent (each write is its own transaction).
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError

from cts.foundation.disk import storage_errors, storage_full
from cts.foundation.filesystems import network_filesystem
from cts.foundation.yaml_config import ConfigError
from cts.serving.engine import ChatModel, Wrapped
from cts.serving.errors import ConstrainedOutputError
from cts.serving.outputs import validate_output
from cts.serving.types import ChatRequest, ChatResponse, OutputSpec

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    engine TEXT NOT NULL,
    response TEXT NOT NULL,
    created REAL NOT NULL
)
"""


class CacheFileError(ConfigError):
    """A cache file that is not a readable SQLite database (a stray file, a truncated copy)."""


# Primary result codes (the low byte of extended ones) that mean the file itself is bad.
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26
#: "database or disk is full": a write found no space (SQLite rolls the write back).
_SQLITE_FULL = 13
#: The file cannot be opened for writing: permission denied, a read-only file or file system,
#: a path that is a folder.
_SQLITE_UNWRITABLE = (3, 8, 14)  # PERM, READONLY, CANTOPEN


@contextmanager
def guard_cache_file(path: Path) -> Iterator[None]:
    """Turn SQLite's "file is not a database" / "disk image is malformed" into a
    CacheFileError naming the file and how to move it aside, "unable to open" and "readonly
    database" into one naming it and how to go on, and "database or disk is full" into
    StorageFull (which stops a run); other errors pass unchanged."""
    try:
        yield
    except sqlite3.DatabaseError as e:
        code = getattr(e, "sqlite_errorcode", None)
        if code is not None and code & 0xFF == _SQLITE_FULL:
            raise storage_full(path) from e
        if code is not None and code & 0xFF in _SQLITE_UNWRITABLE:
            raise CacheFileError(
                f"cache file {path} cannot be opened for writing ({e}): make it and its "
                "folder writable, or choose another cache path (cache.path, "
                "search.tool_cache), or run without the response cache "
                "(--set cache.enabled=false)"
            ) from e
        if code is None or code & 0xFF not in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
            raise
        raise CacheFileError(
            f"cache file {path} is not a readable SQLite database ({e}); move it aside with "
            f"`mv {path} {path}.corrupt` (and {path}-wal, {path}-shm if present) and rerun: "
            "a fresh cache is created"
        ) from e


def journal_mode(path: Path) -> str:
    """WAL on a local file system; DELETE (a rollback journal) on a network one, where WAL's
    shared-memory index cannot be shared by processes on different hosts (SQLite's WAL docs)."""
    return "DELETE" if network_filesystem(path.parent) else "WAL"


def open_shared_sqlite(path: Path, schema: str) -> sqlite3.Connection:
    """A connection several processes (Slurm tasks) can write through at once: WAL (or a
    rollback journal on a network file system, `journal_mode`), and autocommit so that each
    write is its own short transaction and concurrent writers wait (busy_timeout) instead of
    failing. Callers guard it with a lock across threads. A file that is not a readable SQLite
    database raises CacheFileError."""
    with storage_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    with guard_cache_file(path):
        db = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
    try:
        with guard_cache_file(path):
            _prepare(db, schema, journal_mode(path))
    except BaseException:
        db.close()
        raise
    return db


def _prepare(db: sqlite3.Connection, schema: str, journal: str) -> None:
    db.execute("PRAGMA busy_timeout = 60000")
    # Switching a file's journal mode needs an exclusive lock, and SQLite does not wait on the
    # busy handler for it: two Slurm tasks opening a fresh cache at once got "database is
    # locked".
    deadline = time.monotonic() + 60
    while True:
        try:
            db.execute(f"PRAGMA journal_mode = {journal}")
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05 + random.random() * 0.2)
    # A rollback journal is only safe with full syncs: NORMAL is WAL's (durable at checkpoints).
    db.execute(f"PRAGMA synchronous = {'NORMAL' if journal == 'WAL' else 'FULL'}")
    db.execute(schema)


class ResponseCache:
    """A key → ChatResponse store. One connection per process, guarded by a lock."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self._db = open_shared_sqlite(self.path, _SCHEMA)
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.invalid = 0

    def get(self, key: str, output: OutputSpec | None = None) -> ChatResponse | None:
        """The stored answer for `key`, or None. A row that does not parse as a response, or
        whose text fails `output` (the request's spec), is deleted and counted as a miss and
        as `invalid`, so the caller asks the model again and stores the fresh answer."""
        with self._lock, guard_cache_file(self.path):
            row = self._db.execute(
                "SELECT response FROM responses WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            self.misses += 1
            return None
        try:
            response = ChatResponse.model_validate_json(row[0])
            if output is not None:
                response.parsed = validate_output(output, response.text)
        except (ValidationError, ConstrainedOutputError):
            self.misses += 1
            self.invalid += 1
            with self._lock, guard_cache_file(self.path):
                # Only this exact row: another process may already have replaced it.
                self._db.execute(
                    "DELETE FROM responses WHERE key = ? AND response = ?", (key, row[0])
                )
            return None
        self.hits += 1
        return response

    def put(self, key: str, engine_identity: str, response: ChatResponse) -> None:
        blob = response.model_copy(update={"cached": False}).model_dump_json()
        with self._lock, guard_cache_file(self.path):
            self._db.execute(
                "INSERT OR IGNORE INTO responses (key, engine, response, created) "
                "VALUES (?, ?, ?, ?)",
                (key, engine_identity, blob, time.time()),
            )

    def __len__(self) -> int:
        with self._lock, guard_cache_file(self.path):
            return int(self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def stats(self) -> dict[str, int]:
        """`misses` counts every model call the cache could not save, `invalid` the stored
        rows among them that failed re-validation and were asked again."""
        return {"hits": self.hits, "misses": self.misses, "invalid": self.invalid}

    def close(self) -> None:
        with self._lock:
            self._db.close()


#: What a cached answer was asked for. Keys carry it, so that golden construction's answers
#: never answer an evaluation run (its `oracle` searches the same fused queries) and the reverse.
EVALUATION, GOLDEN_CONSTRUCTION = "evaluation", "golden"
PURPOSES = (EVALUATION, GOLDEN_CONSTRUCTION)


class CachedEngine(Wrapped):
    """Wraps an engine (same `ChatModel` interface); identical concurrent requests share one
    model call. `purpose` (EVALUATION or GOLDEN_CONSTRUCTION) is part of every key."""

    def __init__(self, inner: ChatModel, cache: ResponseCache, purpose: str = EVALUATION) -> None:
        super().__init__(inner)
        self.cache = cache
        self.purpose = purpose
        self._in_flight: dict[str, asyncio.Future[ChatResponse]] = {}

    async def chat(self, request: ChatRequest) -> ChatResponse:
        if request.sampling.seed is None:
            return await self.inner.chat(request)
        key = request.key(self.identity, self.purpose)
        hit = self.cache.get(key, request.output)
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
