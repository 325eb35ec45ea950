from __future__ import annotations

import asyncio
import multiprocessing as mp
import sqlite3
from collections.abc import Callable

import pytest

from cts.serving.cache import CachedEngine, ResponseCache
from cts.serving.errors import ConstrainedOutputError
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import ChatRequest, ChoiceOutput


def requests(n: int, seed: int | None = 0) -> list[ChatRequest]:
    return [ChatRequest.of([{"role": "user", "content": f"q{i}"}], seed=seed) for i in range(n)]


async def run_all(engine, reqs):
    return await asyncio.gather(*(engine.chat(r) for r in reqs))


def exit_codes(target: Callable[..., None], args: list[tuple[object, ...]]) -> list[int | None]:
    """Run `target` once per `args` in processes of their own, as jobs share a cache file."""
    context = mp.get_context("spawn")
    workers = [context.Process(target=target, args=a) for a in args]
    for w in workers:
        w.start()
    for w in workers:
        w.join(300)  # a hang guard
    return [w.exitcode for w in workers]


def test_second_identical_run_makes_zero_model_calls(tmp_path):
    path = tmp_path / "cache.sqlite"
    first = ScriptedEngine(lambda r: "answer " + r.messages[0].content)
    out1 = asyncio.run(run_all(CachedEngine(first, ResponseCache(path)), requests(10)))
    assert len(first.requests) == 10

    second = ScriptedEngine(lambda r: pytest.fail("the model was called on a re-run"))
    cache = ResponseCache(path)  # a new process would open the file afresh, like this
    out2 = asyncio.run(run_all(CachedEngine(second, cache), requests(10)))
    assert second.requests == []
    assert [r.text for r in out2] == [r.text for r in out1]
    assert all(r.cached for r in out2)
    assert cache.stats() == {"hits": 10, "misses": 0, "invalid": 0}


def test_unseeded_requests_bypass_the_cache(tmp_path):
    engine = ScriptedEngine(lambda r: "x")
    cached = CachedEngine(engine, ResponseCache(tmp_path / "c.sqlite"))
    asyncio.run(run_all(cached, requests(3, seed=None)))
    asyncio.run(run_all(cached, requests(3, seed=None)))
    assert len(engine.requests) == 6


def test_identical_concurrent_requests_share_one_call(tmp_path):
    engine = ScriptedEngine(lambda r: "x", delay_s=0.05)
    cached = CachedEngine(engine, ResponseCache(tmp_path / "c.sqlite"))
    out = asyncio.run(run_all(cached, requests(1) * 5))
    assert len(engine.requests) == 1
    assert sum(r.cached for r in out) == 4


def test_errors_and_invalid_answers_are_never_cached(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    engine = ScriptedEngine(lambda r: "maybe")
    cached = CachedEngine(engine, cache)
    req = ChatRequest.of([{"role": "user", "content": "?"}], ChoiceOutput(choices=("yes", "no")))
    for _ in range(2):
        with pytest.raises(ConstrainedOutputError):
            asyncio.run(cached.chat(req))
    assert len(engine.requests) == 2
    assert len(cache) == 0
    assert engine.stats.errors == {"constrained_output_invalid": 2}


def _writer(path: str, worker: int, n: int) -> None:
    async def go() -> None:
        engine = ScriptedEngine(lambda r: f"{r.messages[0].content} by {worker}")
        cached = CachedEngine(engine, ResponseCache(path))
        # Half the keys are shared by every worker, half are the worker's own.
        shared = [ChatRequest.of([{"role": "user", "content": f"shared{i}"}]) for i in range(n)]
        own = [ChatRequest.of([{"role": "user", "content": f"w{worker}-{i}"}]) for i in range(n)]
        for r in [x for pair in zip(shared, own, strict=True) for x in pair]:
            await cached.chat(r)

    asyncio.run(go())


def test_processes_sharing_one_cache_file_leave_it_consistent(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    assert exit_codes(_writer, [(path, w, 150) for w in range(4)]) == [0] * 4
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert db.execute("SELECT COUNT(*) FROM responses").fetchone() == (150 + 4 * 150,)
    cache = ResponseCache(path)
    for i in range(150):
        key = ChatRequest.of([{"role": "user", "content": f"shared{i}"}]).key("scripted:scripted")
        hit = cache.get(key)
        assert hit is not None and hit.text.startswith(f"shared{i} by ")


def _open_at_once(path: str, barrier) -> None:  # type: ignore[no-untyped-def]
    from cts.serving.cache import ResponseCache

    barrier.wait()
    ResponseCache(path).close()


def test_processes_opening_a_new_cache_at_once_all_succeed(tmp_path):
    """Slurm array tasks start together and open the same fresh cache file: switching it to
    WAL must wait for the others, not fail with "database is locked"."""
    for attempt in range(3):
        path = str(tmp_path / f"fresh-{attempt}.sqlite")
        barrier = mp.get_context("spawn").Barrier(8)
        assert exit_codes(_open_at_once, [(path, barrier)] * 8) == [0] * 8


def _network_writer(path: str, worker: int, n: int) -> None:
    import cts.foundation.filesystems

    # The detector faked: statfs says NFS, as it would for a home shared by the nodes.
    cts.foundation.filesystems.statfs_type = lambda p: 0x6969  # type: ignore[assignment]
    _writer(path, worker, n)


def test_a_cache_on_a_network_file_system_uses_a_rollback_journal(tmp_path, monkeypatch):
    """SQLite's WAL needs every process on one host: on NFS, Lustre or GPFS (statfs type) the
    caches use a rollback journal with its file locks instead."""
    import cts.foundation.filesystems
    from cts.serving.cache import journal_mode
    from cts.webdancer.tool_cache import ToolCache

    assert journal_mode(tmp_path / "local.sqlite") == "WAL"  # the real statfs: a local disk
    monkeypatch.setattr(cts.foundation.filesystems, "statfs_type", lambda p: 0x0BD00BD0)  # Lustre
    assert journal_mode(tmp_path / "c.sqlite") == "DELETE"
    ResponseCache(tmp_path / "c.sqlite").close()
    ToolCache(tmp_path / "tools.sqlite").close()
    for name in ("c.sqlite", "tools.sqlite"):
        db = sqlite3.connect(tmp_path / name)
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",), name
    # A cache made in WAL mode (on a local disk, then copied) is switched when opened there.
    monkeypatch.setattr(cts.foundation.filesystems, "statfs_type", lambda p: 0xEF53)  # ext4
    ResponseCache(tmp_path / "was-wal.sqlite").close()
    monkeypatch.setattr(cts.foundation.filesystems, "statfs_type", lambda p: 0x6969)  # NFS
    ResponseCache(tmp_path / "was-wal.sqlite").close()
    db = sqlite3.connect(tmp_path / "was-wal.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)


def test_processes_sharing_a_cache_on_a_network_file_system_leave_it_consistent(tmp_path):
    """Four processes writing one cache through the rollback-journal path (the detector faked in
    each): every row there, the file intact, never a WAL file."""
    path = str(tmp_path / "shared.sqlite")
    assert exit_codes(_network_writer, [(path, w, 100) for w in range(4)]) == [0] * 4
    assert not (tmp_path / "shared.sqlite-wal").exists()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert db.execute("SELECT COUNT(*) FROM responses").fetchone() == (100 + 4 * 100,)
