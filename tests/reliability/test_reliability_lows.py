"""The low-severity faults of the third probe: each is one clear message naming the file, line or
option, exit 2, where a traceback (or a 500) came before."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.viewer.app import make_app
from cts.eval.viewer.listen import allowed_hosts
from cts.eval.viewer.view import Viewer
from cts.serving.cache import CacheFileError, ResponseCache
from cts.webdancer.tool_cache import ToolCache
from tests.eval.interop.test_nuggetizer import CREATED
from tests.eval.interop.test_nuggetizer import dataset as dataset  # the fixture
from tests.eval.viewer.test_view import LOCAL, make_run
from tests.reliability.test_reliability_disk import ran_in_a_namespace, tmpfs
from tests.scripted_cts import cts

runner = CliRunner()


# -- the viewer: a trace nested too deeply ------------------------------------------------------


@pytest.mark.parametrize("depth", [900, 100_000], ids=["parses", "too-deep-to-parse"])
def test_a_deeply_nested_trace_is_a_trace_error_not_a_500(tmp_path, depth):
    """Too deep for json.loads: the sample says why there is no trace. Deep but parseable (a
    tool call's arguments): shown down to a depth, the rest left to the raw file."""
    records = make_run(tmp_path / "run", limit=1)
    record = next(r for r in records if r.trace_id)
    trace = tmp_path / "run" / "traces" / str(record.trace_id)
    if depth > 1000:
        trace.write_text("[" * depth + "]" * depth)
    else:
        loaded = json.loads(trace.read_text())
        loaded["steps"][1]["arguments"] = json.loads("[" * depth + "]" * depth)
        trace.write_text(json.dumps(loaded))
    client = TestClient(make_app(Viewer([tmp_path / "run"]), allowed_hosts("127.0.0.1")), LOCAL)
    params = {
        "run": 0,
        "instance": record.instance_id,
        "condition": record.condition,
        "seed": record.seed,
    }
    response = client.get("/api/sample", params=params)
    assert response.status_code == 200, response.text[:500]
    sample = response.json()
    if depth > 1000:
        assert sample["trace"] is None
        assert sample["trace_error"] == "trace file unreadable: JSON nested too deeply"
    else:
        assert sample["cut"] and "nested more than 32 deep" in response.text


# -- golden import: a lone surrogate in a nugget ------------------------------------------------


def test_golden_import_of_a_nugget_with_a_lone_surrogate_names_its_line_and_field(
    tmp_path, dataset
):
    row = json.loads(json.dumps(CREATED[0]))
    row["nuggets"][1]["text"] = "Python was created by \ud800"
    given = tmp_path / "n.jsonl"
    given.write_text(json.dumps(CREATED[1]) + "\n" + json.dumps(row) + "\n")  # \ud800 escaped
    out = tmp_path / "merged.jsonl"
    args = ["golden", "import", str(given), "--from", "nuggetizer", "--dataset", str(dataset)]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert f"{given}:2: <row>: nuggets[1].text holds a lone surrogate" in result.output
    assert not out.exists()


# -- a cache that cannot be opened --------------------------------------------------------------


def test_a_cache_path_that_is_a_folder_is_a_clear_config_error(tmp_path):
    for open_cache in (ResponseCache, ToolCache):
        with pytest.raises(CacheFileError, match=f"cache file {tmp_path} cannot be opened"):
            open_cache(tmp_path)
    result = cts(
        ["run", "--limit", "1", "--output-dir", str(tmp_path / "run"),
         "--set", f"cache.path={tmp_path}"],
        tmp_path / "home",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert f"cache file {tmp_path} cannot be opened for writing" in result.stderr


def test_a_cache_on_a_read_only_file_system_is_a_clear_config_error(request, tmp_path):
    """An existing cache (SQLite needs its -wal and -shm beside it) and a new one."""
    if ran_in_a_namespace(request, tmp_path):
        return
    with tmpfs(tmp_path / "ro", "size=1m") as root:
        ResponseCache(root / "old.sqlite").close()
        subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
        for path in (root / "old.sqlite", root / "new.sqlite"):
            for open_cache in (ResponseCache, ToolCache):
                with pytest.raises(CacheFileError) as refused:
                    open_cache(path)
                assert f"cache file {path} cannot be opened for writing" in str(refused.value)
                assert "cache.enabled=false" in str(refused.value)


# -- cts run: a missing or bad corpus -----------------------------------------------------------


@pytest.mark.parametrize("corpus", ["missing", "bad"])
def test_cts_run_with_a_missing_or_bad_corpus_exits_2_before_writing_anything(tmp_path, corpus):
    path = tmp_path / "corpus.jsonl"
    if corpus == "bad":
        path.write_text('{"doc_id": "d1", "url": "u"}\nnot json\n')
    run_dir = tmp_path / "run"
    result = cts(
        ["run", "--limit", "1", "--output-dir", str(run_dir), "--set", f"search.corpus={path}",
         "--set", f"cache.path={tmp_path / 'r.sqlite'}"],
        tmp_path / "home",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "corpus error" in result.stderr
    expected = (
        f"{path}: <file>: no such file" if corpus == "missing" else f"{path}:1: text: missing"
    )
    assert expected in result.stderr
    assert not (run_dir / "config.yaml").exists()
    assert not Path(tmp_path / "r.sqlite").exists()
