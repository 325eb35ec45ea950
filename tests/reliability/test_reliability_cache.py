"""Reliability of the response and tool caches (issue 13 §1.11): a cached answer is checked
against its request's output spec before it is trusted, and a corrupt cache file is a clear,
actionable error naming the file instead of a raw sqlite3 traceback."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pytest
from pydantic import BaseModel

from cts.foundation.yaml_config import ConfigError
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import ChatRequest, ChoiceOutput, JsonSchemaOutput, RegexOutput

if TYPE_CHECKING:
    from cts.serving.cache import ResponseCache


class Verdict(BaseModel):
    label: Literal["full", "partial", "none"]


VERDICT = JsonSchemaOutput.of(Verdict)


def _ask(engine, path, request):  # type: ignore[no-untyped-def]
    from cts.serving.cache import CachedEngine, ResponseCache

    cache = ResponseCache(path)
    try:
        return asyncio.run(CachedEngine(engine, cache).chat(request)), cache.stats()
    finally:
        cache.close()


def _poison(path, text: str | None = None, blob: str | None = None) -> None:  # type: ignore[no-untyped-def]
    """Edit the one stored row by hand, as a person (or a bad merge) could."""
    db = sqlite3.connect(path)
    (old,) = db.execute("SELECT response FROM responses").fetchone()
    if blob is None:
        blob = json.dumps({**json.loads(old), "text": text})
    db.execute("UPDATE responses SET response = ?", (blob,))
    db.commit()
    db.close()


@pytest.mark.parametrize(
    ("spec", "good", "bad"),
    [
        (VERDICT, '{"label": "partial"}', '{"label": "everything"}'),  # edited off-schema
        (VERDICT, '{"label": "partial"}', '{"label": "par'),  # truncated JSON
        (ChoiceOutput(choices=("yes", "no")), "no", "definitely"),
        (RegexOutput(pattern=r"[0-9]{4}"), "2024", "20x4"),
    ],
    ids=["schema", "truncated-json", "choice", "regex"],
)
def test_a_cached_answer_that_fails_its_output_spec_is_asked_again(tmp_path, spec, good, bad):
    path = tmp_path / "c.sqlite"
    request = ChatRequest.of([{"role": "user", "content": "judge"}], spec, seed=0)
    _ask(ScriptedEngine(lambda r: good), path, request)
    _poison(path, text=bad)

    engine = ScriptedEngine(lambda r: good)
    response, stats = _ask(engine, path, request)
    assert len(engine.requests) == 1, "the poisoned row was returned without asking the model"
    assert response.text == good and not response.cached
    assert stats["invalid"] == 1 and stats["hits"] == 0

    # The fresh answer replaced the row: the next run is a plain hit.
    again = ScriptedEngine(lambda r: pytest.fail("the model was called for a repaired row"))
    response, stats = _ask(again, path, request)
    assert response.text == good and response.cached
    assert stats == {"hits": 1, "misses": 0, "invalid": 0}


def test_a_cached_row_that_is_not_a_response_is_asked_again(tmp_path):
    path = tmp_path / "c.sqlite"
    request = ChatRequest.of([{"role": "user", "content": "free text"}], seed=0)
    _ask(ScriptedEngine(lambda r: "fine"), path, request)
    _poison(path, blob='{"text": "fi')  # a truncated blob
    engine = ScriptedEngine(lambda r: "fine")
    response, stats = _ask(engine, path, request)
    assert len(engine.requests) == 1 and response.text == "fine"
    assert stats["invalid"] == 1


def test_the_parsed_value_of_a_cached_answer_comes_from_its_text(tmp_path):
    """A row whose `parsed` was edited (text still valid) must not smuggle in another value."""
    path = tmp_path / "c.sqlite"
    request = ChatRequest.of([{"role": "user", "content": "judge"}], VERDICT, seed=0)
    _ask(ScriptedEngine(lambda r: '{"label": "none"}'), path, request)
    db = sqlite3.connect(path)
    (old,) = db.execute("SELECT response FROM responses").fetchone()
    db.execute(
        "UPDATE responses SET response = ?",
        (json.dumps({**json.loads(old), "parsed": {"label": "full"}}),),
    )
    db.commit()
    db.close()
    response, _ = _ask(ScriptedEngine(lambda r: pytest.fail("valid row")), path, request)
    assert response.parsed == {"label": "none"}


def _cache_error():  # type: ignore[no-untyped-def]
    from cts.serving import cache

    return getattr(cache, "CacheFileError", ConfigError)


def _opening_junk(open_cache: Callable[[Path], object], path: Path, junk: str) -> BaseException:
    """What opening a cache raises once its file holds `junk`, as a person's edit could leave."""
    path.write_text(junk)
    with pytest.raises(Exception) as caught:
        open_cache(path)
    return caught.value


def _assert_actionable(error: BaseException, path) -> None:  # type: ignore[no-untyped-def]
    assert isinstance(error, ConfigError), f"raw {type(error).__name__}: {error}"
    message = str(error)
    assert str(path) in message
    assert f"mv {path} {path}.corrupt" in message


def test_a_cache_file_that_is_not_sqlite_is_a_clear_config_error(tmp_path):
    from cts.serving.cache import ResponseCache

    path = tmp_path / "responses.sqlite"
    error = _opening_junk(ResponseCache, path, "these are my notes, not a database\n" * 100)
    _assert_actionable(error, path)
    assert isinstance(error, _cache_error())


def test_a_truncated_cache_file_is_a_clear_config_error(tmp_path):
    from cts.serving.cache import ResponseCache

    path = tmp_path / "responses.sqlite"
    reqs = _fill_a_response_cache(path)
    data = path.read_bytes()
    assert len(data) > 40_000
    path.write_bytes(data[: len(data) // 3])

    with pytest.raises(Exception) as caught:
        _ask_all(ResponseCache(path), reqs)
    _assert_actionable(caught.value, path)


def _ask_all(cache: ResponseCache, reqs: list[ChatRequest]) -> None:
    """Ask every request, one after the other, through `cache`: each reads (or writes) a row."""
    from cts.serving.cache import CachedEngine

    async def ask() -> None:
        engine = CachedEngine(ScriptedEngine(lambda r: "a" * 300), cache)
        for r in reqs:
            await engine.chat(r)

    asyncio.run(ask())


def _fill_a_response_cache(path: Path) -> list[ChatRequest]:
    """A response cache of many pages (400 long rows), so damage can miss its header."""
    from cts.serving.cache import ResponseCache

    reqs = [
        ChatRequest.of([{"role": "user", "content": f"q{i}" + "x" * 500}], seed=0)
        for i in range(400)
    ]
    cache = ResponseCache(path)
    _ask_all(cache, reqs)
    cache.close()
    return reqs


def test_a_tool_cache_file_that_is_not_sqlite_is_a_clear_config_error(tmp_path):
    from cts.webdancer.tool_cache import ToolCache

    path = tmp_path / "tools.sqlite"
    _assert_actionable(_opening_junk(ToolCache, path, "not a database\n" * 100), path)


def test_the_cli_exits_2_on_a_corrupt_cache(tmp_path):
    """cts prints a ConfigError and exits 2 (cts/cli/common.py EXITS)."""
    from cts.cli.common import exit_for
    from cts.serving.cache import ResponseCache

    path = tmp_path / "responses.sqlite"
    found = exit_for(_opening_junk(ResponseCache, path, "junk\n" * 100))
    assert found is not None and found[1] == 2
    assert str(path) in found[0]


def test_a_tool_cache_corrupt_inside_is_a_clear_config_error(tmp_path):
    from cts.webdancer.tool_cache import ToolCache

    path = tmp_path / "tools.sqlite"
    cache = ToolCache(path)
    for i in range(400):
        cache.put("search", "local", {"query": f"q{i}" + "x" * 500}, ["r" * 300])
    cache.close()
    _scribble_over_the_middle(path)
    with pytest.raises(Exception) as caught:
        cache = ToolCache(path)
        for i in range(400):
            cache.get("search", "local", {"query": f"q{i}" + "x" * 500})
    _assert_actionable(caught.value, path)


def _scribble_over_the_middle(path) -> None:  # type: ignore[no-untyped-def]
    """Corrupt the middle third of the file, keeping its size: opening still succeeds and the
    damage shows only when a read reaches it."""
    data = bytearray(path.read_bytes())
    n = len(data)
    data[n // 3 : 2 * n // 3] = b"\xff" * (2 * n // 3 - n // 3)
    path.write_bytes(bytes(data))


def test_a_response_cache_corrupt_inside_is_a_clear_config_error(tmp_path):
    from cts.serving.cache import ResponseCache

    path = tmp_path / "responses.sqlite"
    reqs = _fill_a_response_cache(path)
    _scribble_over_the_middle(path)
    cache = ResponseCache(path)  # the header is intact: opening succeeds
    with pytest.raises(Exception) as caught:
        _ask_all(cache, reqs)
    _assert_actionable(caught.value, path)


@pytest.mark.parametrize("cache", ["response", "tool"])
def test_a_run_over_a_cache_damaged_inside_stops_with_exit_2_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: str
):
    """A cache damaged inside (pages zeroed; opening still succeeds) was found on lookup by the
    pipeline's catch-all: every key became an `internal` failure counted as done, the run
    exited 0 and a resume skipped them; on a shared $CTS_HOME every shard of a sweep
    "finished" so. Now the first lookup stops the run, exit 2, naming the file; nothing is
    recorded for the keys it stopped, so a resume once the file is moved aside runs them."""
    from typer.testing import CliRunner

    import cts.eval.experiment as experiment_module
    from cts.cli import app
    from cts.eval.run.records import RecordStore
    from tests.scripted_cts import scripted_engines

    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(experiment_module, "open_engines", scripted_engines)
    path = tmp_path / f"{cache}s.sqlite"
    where = "cache.path" if cache == "response" else "search.tool_cache"
    common = ["--limit", "2", "--set", f"{where}={path}", "--set", "search.date=2026-11-30"]
    first = CliRunner().invoke(app, ["run", "--output-dir", str(tmp_path / "a"), *common])
    assert first.exit_code == 0, first.output
    data = bytearray(path.read_bytes())
    data[4096:] = b"\xff" * (len(data) - 4096)  # every page but the first, with the schema
    path.write_bytes(bytes(data))
    damaged = CliRunner().invoke(app, ["run", "--output-dir", str(tmp_path / "b"), *common])
    assert damaged.exit_code == 2, damaged.output
    assert str(path) in damaged.output and f"{path}.corrupt" in damaged.output
    written = RecordStore(tmp_path / "b").completed().values()
    assert not [r for r in written if r.error and r.error.get("kind") == "internal"]
