"""Two shards of one run at once: `cts run --shard 0/2` and `--shard 1/2` as real processes
writing the same run directory and the same $CTS_HOME (its response and tool caches), again and
again with other timings, with and without clarification dialogues.

Afterwards nothing is corrupt: `cts merge` succeeds with every key exactly once, every line
parses, the SQLite caches pass `PRAGMA integrity_check` with every row valid, config.yaml is
the one a single run writes, and records, dialogues and cache rows equal a single unsharded
run's.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.run.config_sections import ALL_CONDITIONS
from cts.eval.run.dialogue import Dialogue
from cts.eval.run.records import RecordStore, parse_records
from cts.serving.types import ChatResponse
from tests.fault_helpers import cts_run_args
from tests.scripted_cts import start

LIMIT = 10
VARIANTS = {
    # Keys without clarification: records, traces and the caches are shared.
    "records": ["blurred", "oracle"],
    # clarify@k too: both shards also write dialogues/ (each reads the whole folder).
    "dialogues": list(ALL_CONDITIONS),
}


def run_args(run_dir: Path, variant: str, shard: str | None = None) -> list[str]:
    args = cts_run_args(run_dir, LIMIT, f"conditions=[{', '.join(VARIANTS[variant])}]")
    return [*args, "--shard", shard] if shard else args


def finish(process: subprocess.Popen[str]) -> None:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, out[-2000:] + err[-3000:]
    assert "Traceback" not in out + err


# -- what a run leaves -----------------------------------------------------------------------


@dataclass
class Left:
    """What a run left in its run directory and $CTS_HOME, in comparable form."""

    records: dict[tuple[str, str, int], dict]
    dialogues: list[str]
    responses: dict[str, tuple[str, str]]
    tool_calls: dict[str, tuple[str, str]]
    config: str


def read_left(run_dir: Path, home: Path) -> Left:
    store = RecordStore(run_dir)
    lines = 0
    for path in store.all_files():
        data = path.read_bytes()
        records, complete = parse_records(path, data)  # a line that is not a record raises
        assert complete == len(data), f"{path}: a torn last line"
        lines += len(records)
    done = store.completed()
    assert lines == len(done), "a key recorded twice"
    dialogues: list[str] = []
    for path in sorted((run_dir / "dialogues").glob("*.jsonl")):
        for line in path.read_text().splitlines(keepends=True):
            assert line.endswith("\n"), path
            # Less what each line asked, which, like a record's usage, depends on timing
            # (which of two keys' identical requests the cache answered).
            dialogue = Dialogue.model_validate_json(line)
            dialogues.append(dialogue.model_dump_json(exclude={"usage"}))
    # Each dialogue is saved turn by turn (and once more if it stops or fails): a turn is
    # never asked twice, in one shard or by two.
    once = Counter(
        (d.instance_id, d.seed, len(d.turns), d.stopped, bool(d.error))
        for d in map(Dialogue.model_validate_json, dialogues)
    )
    assert set(once.values()) <= {1}, "a dialogue turn written twice"
    return Left(
        records={k: r.model_dump(exclude={"seconds", "usage"}) for k, r in done.items()},
        dialogues=sorted(dialogues),
        responses=rows(home / "cache" / "responses.sqlite", "responses", "engine, response"),
        tool_calls=rows(home / "cache" / "tools.sqlite", "tool_calls", "arguments, result"),
        config=(run_dir / "config.yaml").read_text(),
    )


def rows(path: Path, table: str, columns: str) -> dict[str, tuple[str, str]]:
    """key → row of a cache that passes integrity_check, each row valid."""
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)], path
        found = {key: (a, b) for key, a, b in db.execute(f"SELECT key, {columns} FROM {table}")}
    finally:
        db.close()
    for first, second in found.values():
        if table == "responses":
            ChatResponse.model_validate_json(second)
        else:
            json.loads(first), json.loads(second)
    return found


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Left]]:
    """Per variant, a single unsharded run ($CTS_HOME with the search index, what it left)."""
    root = tmp_path_factory.mktemp("reference")
    running = {v: start(run_args(root / v / "run", v), root / v / "home") for v in VARIANTS}
    for process in running.values():
        finish(process)
    return {
        v: (root / v / "home", read_left(root / v / "run", root / v / "home")) for v in VARIANTS
    }


ROUNDS = [
    # variant, (most delay of a model call in s, pause before the second shard starts in s)
    ("records", 0.0, 0.0),
    ("records", 0.02, 0.3),
    ("dialogues", 0.01, 0.0),
    ("dialogues", 0.0, 0.15),
]


@pytest.mark.parametrize(("variant", "delay_s", "stagger_s"), ROUNDS)
def test_two_shards_sharing_a_run_directory_and_cache_merge_to_a_single_runs_results(
    variant: str,
    delay_s: float,
    stagger_s: float,
    tmp_path: Path,
    references: dict[str, tuple[Path, Left]],
) -> None:
    reference_home, expected = references[variant]
    home, run_dir = tmp_path / "home", tmp_path / "run"
    shutil.copytree(reference_home / "indexes", home / "indexes")  # the caches start empty
    shards = []
    for index in (0, 1):
        if index and stagger_s:
            time.sleep(stagger_s)
        timing = {"CTS_SCRIPTED_DELAY_S": str(delay_s), "CTS_SCRIPTED_TIMING": f"{delay_s}-{index}"}
        shards.append(start(run_args(run_dir, variant, f"{index}/2"), home, **timing))
    for process in shards:
        finish(process)

    merged = CliRunner().invoke(app, ["merge", str(run_dir)])
    assert merged.exit_code == 0, merged.output
    assert f"merged {LIMIT * len(VARIANTS[variant])} records" in merged.output
    left = read_left(run_dir, home)
    assert left.config == expected.config
    assert left.records == expected.records
    assert left.dialogues == expected.dialogues
    assert bool(left.dialogues) == (variant == "dialogues")
    assert left.responses == expected.responses
    assert left.tool_calls == expected.tool_calls
    for condition in VARIANTS[variant]:
        path = run_dir / "records" / condition / "merged.jsonl"
        assert len(parse_records(path, path.read_bytes())[0]) == LIMIT
